#include "launcher/agent_options.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "launcher/coordinator.h"
#include "runtime/error.h"
#include "runtime/files.h"

namespace tessera::launcher {

std::pair<std::string, int> split_host_port(const std::string& hp) {
  auto colon = hp.rfind(':');
  TESSERA_ARG_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < hp.size(), "--coordinator '", hp,
                    "' is not HOST:PORT");
  std::string host = hp.substr(0, colon);
  // An IPv6 address is written in brackets: "::1" would read as host ":", port 1.
  TESSERA_ARG_CHECK(host.find(':') == std::string::npos || (host.front() == '[' && host.back() == ']'),
                    "--coordinator '", hp, "' is not HOST:PORT (an IPv6 address goes in brackets: [::1]:29500)");
  int port = 0;
  try {
    size_t pos = 0;
    port = std::stoi(hp.substr(colon + 1), &pos);
    if (pos != hp.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
    port = -1;
  }
  TESSERA_ARG_CHECK(port >= 0 && port <= 65535, "--coordinator '", hp, "': bad port");
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, port};
}

PortReservation reserve_port(int port) {
  PortReservation r;
  r.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (r.fd < 0) throw Error(detail::concat("socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(r.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof a;
  if (::bind(r.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(r.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int e = errno;
    ::close(r.fd);
    throw InvalidArgument(
        detail::concat("--master-port ", port, ": cannot reserve the port for rank 0's store: ", std::strerror(e)));
  }
  r.port = ntohs(a.sin_port);
  return r;
}

std::string resolve_program(const std::string& prog) {
  auto ok = [](const std::string& p) {
    struct stat st {};
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
  };
  if (prog.find('/') != std::string::npos) {
    TESSERA_ARG_CHECK(ok(prog), "program '", prog, "' does not exist or is not executable");
    return prog;
  }
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string dir = p.substr(start, end - start);
    std::string cand = (dir.empty() ? "." : dir) + "/" + prog;
    if (ok(cand)) return cand;
    start = end + 1;
  }
  throw InvalidArgument(detail::concat("program '", prog, "' not found in PATH"));
}

std::chrono::milliseconds heartbeat_interval(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 5, std::chrono::milliseconds(50), std::chrono::milliseconds(2000));
}

CheckedRun check_run_options(const RunOptions& opt) {
  if (opt.nproc_per_node < 1) throw InvalidArgument("--nproc-per-node must be at least 1");
  if (opt.nnodes < 1) throw InvalidArgument("--nnodes must be at least 1");
  if (opt.node_rank < 0 || opt.node_rank >= opt.nnodes)
    throw InvalidArgument(detail::concat("--node-rank ", opt.node_rank, " must be in [0, ", opt.nnodes, ")"));
  if (opt.nnodes > 1 && opt.coordinator.empty())
    throw InvalidArgument("--nnodes > 1 needs --coordinator HOST:PORT (node 0's address, the same on every node)");
  if (opt.max_restarts < 0) throw InvalidArgument("--max-restarts must be >= 0");
  if (opt.command.empty()) throw InvalidArgument("no program given (tessera run [options] -- PROGRAM ARGS...)");
  CheckedRun c;
  if (!opt.coordinator.empty()) {
    auto [h, p] = split_host_port(opt.coordinator);
    c.master_addr = h;
    c.coord_addr = opt.coordinator;
    TESSERA_ARG_CHECK(p != 0, "--coordinator needs a fixed port (not 0) so every node finds it");
    TESSERA_ARG_CHECK(opt.master_port != p, "--master-port ", p,
                      " is the coordinator's port; rank 0's store needs a port of its own");
  }
  if (opt.master_port < 0 || opt.master_port > 65535)
    throw InvalidArgument(detail::concat("--master-port ", opt.master_port, " is not a port (0: a free one)"));
  c.master_port = opt.master_port;
  c.program = resolve_program(opt.command[0]);
  const char* tok = std::getenv("TESSERA_JOB_TOKEN");
  if (tok && *tok) {
    c.token = tok;
  } else if (opt.nnodes > 1) {
    throw InvalidArgument("--nnodes > 1: set TESSERA_JOB_TOKEN to the same secret on every node");
  } else {
    c.token = make_job_token();
  }
  if (!opt.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opt.log_dir, ec);
    if (ec) throw InvalidArgument(detail::concat("--log-dir '", opt.log_dir, "': ", ec.message()));
    // An existing directory the logs cannot be created in (a read-only
    // mount) is the same bad value, said now, not at the first worker's log.
    if (const std::string why = file_creation_refusal(opt.log_dir); !why.empty())
      throw InvalidArgument(detail::concat("--log-dir '", opt.log_dir, "': ", why));
  }
  return c;
}

}  // namespace tessera::launcher
