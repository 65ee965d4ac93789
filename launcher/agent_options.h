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
  std::string master_addr;  // host part of coord_addr (MASTER_ADDR)
  int master_port = 0;      // port part (MASTER_PORT)
  std::string token;        // TESSERA_JOB_TOKEN, or a fresh one on a single node
};

// Checks ranges and consistency, resolves the program and the token, and
// creates --log-dir.
CheckedRun check_run_options(const RunOptions& options);

// Splits "host:port" (also "[v6]:port").
std::pair<std::string, int> split_host_port(const std::string& host_port);

// The executable `prog` names: itself when it contains '/', else the first
// match in PATH; it must be a regular, executable file.
std::string resolve_program(const std::string& prog);

// Interval of node and worker heartbeats: timeout/5, within [50 ms, 2 s].
std::chrono::milliseconds heartbeat_interval(std::chrono::milliseconds timeout);

}  // namespace tessera::launcher
