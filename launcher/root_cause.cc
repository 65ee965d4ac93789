#include "launcher/root_cause.h"

#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "launcher/client.h"
#include "runtime/error.h"

namespace tessera::launcher {

namespace pb = tessera::launcher::proto;

pb::ExitReport exit_report(int rank, int node_rank, const std::string& host, int status,
                           const std::deque<std::string>& tail, bool after_stop) {
  pb::ExitReport rep;
  rep.set_rank(rank);
  rep.set_node_rank(node_rank);
  rep.set_host(host);
  rep.set_exit_code(WIFEXITED(status) ? WEXITSTATUS(status) : 0);
  rep.set_signal(WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  for (const auto& line : tail) rep.add_log_tail(line);
  rep.set_after_stop(after_stop);
  return rep;
}

pb::RootCause local_exit_cause(int rank, int node_rank, const std::string& host, int status,
                               const std::deque<std::string>& tail) {
  pb::RootCause c;
  c.set_rank(rank);
  c.set_node_rank(node_rank);
  c.set_host(host);
  c.set_has_exit(true);
  c.set_exit_code(WIFEXITED(status) ? WEXITSTATUS(status) : 0);
  c.set_signal(WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  c.set_reason("exited abnormally");
  for (const auto& line : tail) c.add_log_tail(line);
  return c;
}

pb::RootCause unknown_cause(const std::string& abort_reason) {
  pb::RootCause c;
  c.set_rank(-1);
  c.set_node_rank(-1);
  c.set_reason(abort_reason.empty() ? "unknown" : abort_reason);
  return c;
}

pb::RootCause interrupt_cause(int node_rank, const std::string& host, int sig) {
  pb::RootCause c;
  c.set_rank(-1);
  c.set_node_rank(node_rank);
  c.set_host(host);
  c.set_reason(detail::concat("the launcher got ", strsignal(sig)));
  return c;
}

int exit_code_of_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

int exit_code_of(const pb::RootCause& c) {
  if (!c.has_exit()) return 1;
  if (c.signal()) return 128 + c.signal();
  return c.exit_code() ? c.exit_code() : 1;
}

std::string failure_summary(int round, const pb::RootCause& c, const std::string& log_dir, int node_rank) {
  std::string s = "tessera run: job failed";
  if (round > 0) s += detail::concat(" after ", round, " restart(s)");
  s += "\n  root cause: " + describe_cause(c) + "\n";
  s += detail::concat("    rank:      ", c.rank() >= 0 ? std::to_string(c.rank()) : std::string("-"), "\n");
  s += detail::concat("    node:      ", c.node_rank(), "\n");
  s += detail::concat("    host:      ", c.host(), "\n");
  if (c.has_exit()) {
    if (c.signal())
      s += detail::concat("    signal:    ", c.signal(), " (", strsignal(c.signal()), ")\n");
    else
      s += detail::concat("    exit code: ", c.exit_code(), "\n");
  }
  if (c.log_tail_size() > 0) {
    s += detail::concat("    last ", c.log_tail_size(), " line(s) of rank ", c.rank(), "'s output:\n");
    for (const auto& line : c.log_tail()) s += "      " + line + "\n";
  }
  if (!log_dir.empty() && c.rank() >= 0 && c.node_rank() == node_rank)
    s += detail::concat(
        "    full log:  ", (std::filesystem::path(log_dir) / ("rank_" + std::to_string(c.rank()) + ".log")).string(),
        "\n");
  return s;
}

namespace {

long oom_kill_in(const std::string& file) {
  std::ifstream in(file);
  std::string key;
  long v = 0;
  while (in >> key >> v)
    if (key == "oom_kill") return v;
  return -1;
}

}  // namespace

long oom_kill_count() {
  std::ifstream cg("/proc/self/cgroup");
  std::string line, v2, v1;
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) == 0) v2 = line.substr(3);
    const auto at = line.find(":memory:");
    if (at != std::string::npos) v1 = line.substr(at + 8);
  }
  for (const std::string& f : {"/sys/fs/cgroup" + v2 + "/memory.events", std::string("/sys/fs/cgroup/memory.events"),
                               "/sys/fs/cgroup/memory" + v1 + "/memory.oom_control",
                               std::string("/sys/fs/cgroup/memory/memory.oom_control")}) {
    const long n = oom_kill_in(f);
    if (n >= 0) return n;
  }
  return -1;
}

std::string explain_sigkill(long before) {
  const long now = oom_kill_count();
  if (before >= 0 && now > before)
    return detail::concat(
        "killed by SIGKILL: the kernel's OOM killer chose it (oom_kill of this memory cgroup went from ", before,
        " to ", now, ")");
  if (before < 0 || now < 0) return "killed by SIGKILL (not by this launcher; OOM kills cannot be read here)";
  return "killed by SIGKILL (not by this launcher)";
}

}  // namespace tessera::launcher
