// Checks of `tessera run`'s options, done before the agent starts any thread
// or process. Every check throws InvalidArgument (the CLI exits 2 with the
// usage); none has a side effect except creating --log-dir.
#pragma once

#include <chrono>
#include <string>
#include <utility>

#include "launcher/agent.h"

namespace tessera::launcher {

// What the checked options resolve to.
struct CheckedRun {
  std::string program;      // the executable to start (PATH searched when it has no '/')
  std::string coord_addr;   // host:port the workers and agents dial; empty: node 0 picks 127.0.0.1:<free port>
  std::string master_addr;  // host part of coord_addr (MASTER_ADDR); empty: 127.0.0.1
  int master_port = 0;      // --master-port (MASTER_PORT); 0: node 0 reserves a free one
  std::string token;        // TESSERA_JOB_TOKEN, or a fresh one on a single node
};

// Checks ranges and consistency, resolves the program and the token, and
// creates --log-dir.
CheckedRun check_run_options(const RunOptions& options);

// Node 0's reservation of MASTER_PORT for rank 0's store: a TCP socket bound
// to 0.0.0.0:`port` (0: a free port) with SO_REUSEADDR and never listening,
// held while the job runs. The kernel then hands the port to nobody else (no
// bind(0), no connect's ephemeral port), yet a store that binds it with
// SO_REUSEADDR, as torch's TCPStore does, gets it. Throws InvalidArgument
// naming the port when it is taken.
struct PortReservation {
  int fd = -1;
  int port = 0;
};
PortReservation reserve_port(int port);

// Splits "host:port" (also "[v6]:port").
std::pair<std::string, int> split_host_port(const std::string& host_port);

// The executable `prog` names: itself when it contains '/', else the first
// match in PATH; it must be a regular, executable file.
std::string resolve_program(const std::string& prog);

// Interval of node and worker heartbeats: timeout/5, within [50 ms, 2 s].
std::chrono::milliseconds heartbeat_interval(std::chrono::milliseconds timeout);

}  // namespace tessera::launcher
