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
  // advertised address in tcp_transport.cc); otherwise loopback.
  bool spans_hosts = false;
};

// The address this rank advertises to its peers: TESSERA_TCP_ADDR; else
// 127.0.0.1 when !spans_hosts; else the host name's first non-loopback IPv4
// address (InvalidArgument naming TESSERA_TCP_ADDR when there is none).
std::string advertised_address(bool spans_hosts);

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
