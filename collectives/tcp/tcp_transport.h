// TCP transport: the Transport interface (collectives/transport.h) over
// sockets (Boost.Asio), for ranks on different hosts. Endpoints are exchanged
// through the store. Contract as in transport.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

// clang-format off
// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>
#include <boost/asio/ip/tcp.hpp>
// clang-format on

#include "collectives/communicator.h"
#include "collectives/store.h"
#include "collectives/transport.h"

namespace tessera::collectives::tcp {

struct TcpOptions {
  // links[j]: connect to rank j (the relation must be symmetric over the
  // group). Empty: every peer. Calls to a peer without a link are a bug
  // (InvalidArgument).
  std::vector<bool> links;
  // The group spans hosts: advertise an address other hosts can reach (see
  // advertised_address); otherwise loopback.
  bool spans_hosts = false;
  // Hosts (IPs or names) every host of the job reaches (CommOptions::reach).
  std::vector<std::string> toward;
};

// The address this rank advertises to its peers, the first that works of:
//  1. TESSERA_TCP_ADDR;
//  2. 127.0.0.1 when !spans_hosts;
//  3. with TESSERA_SOCKET_IFNAME set (NCCL_SOCKET_IFNAME's syntax: prefixes,
//     `^` to exclude, `=` for exact names), the first IPv4 address of an up
//     interface it selects, or InvalidArgument listing the interfaces;
//  4. the interface through which this host reaches the first of `toward`
//     (the launcher passes its coordinator's address) that it has a
//     non-loopback route to: a UDP socket connected to it, getsockname (no
//     packet is sent);
//  5. under mpirun, the same toward mpirun's out-of-band address
//     (mpirun_oob_addresses), the interface OpenMPI itself uses;
//  6. the host name's first non-loopback IPv4 address;
// else InvalidArgument listing what was tried and why each failed.
std::string advertised_address(bool spans_hosts, const std::vector<std::string>& toward = {});

// Address of the local interface whose route reaches `host` (an IPv4 address
// or a name), "" with `why` set when it cannot be found.
std::string address_toward(const std::string& host, std::string* why = nullptr);

// The first IPv4 address of an up interface selected by `spec`
// (TESSERA_SOCKET_IFNAME syntax); "" when none. `seen` gets the interfaces
// looked at, for messages.
std::string interface_address(const std::string& spec, std::string* seen = nullptr);

// Under mpirun (OpenMPI 4.x): the IPv4 addresses of mpirun's out-of-band
// listener, from OMPI_MCA_orte_hnp_uri; empty elsewhere.
std::vector<std::string> mpirun_oob_addresses();

// The socket buffer size the transport sets: TESSERA_TCP_SOCKBUF bytes; 0
// (the default, or TESSERA_TCP_SOCKBUF=0) leaves the kernel's buffer
// autotuning on (docs/bench.md, "TCP transport", compares it with fixed
// buffers). Throws InvalidArgument for a value that is not a byte count.
int socket_buffer_bytes();

// Socket options of every connection: TCP_NODELAY, and SO_SNDBUF/SO_RCVBUF
// of `buffer_bytes` when it is positive (0: autotuning).
void set_socket_options(boost::asio::ip::tcp::socket& s, int buffer_bytes);

// Collective over the group: every member calls it with stores sharing keys.
std::unique_ptr<Transport> create_transport(std::shared_ptr<Store> store, int rank, int size,
                                            const CommOptions& options, const TcpOptions& tcp = {});

}  // namespace tessera::collectives::tcp
