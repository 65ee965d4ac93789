#include "launcher/slurm.h"

#include <cctype>
#include <cstdlib>

#include "runtime/env.h"
#include "runtime/error.h"

namespace tessera::launcher {

namespace {

long parse_count(const std::string& s, const char* what) {
  size_t pos = 0;
  long v = -1;
  try {
    v = std::stol(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != s.size() || v < 0) throw InvalidArgument(detail::concat(what, ": '", s, "' is not a count"));
  return v;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  const std::string where = "SLURM_STEP_NODELIST='" + nodelist + "'";
  // The first entry: up to a comma outside brackets.
  size_t end = 0;
  for (int depth = 0; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const std::string first = nodelist.substr(0, end);
  if (first.empty()) throw InvalidArgument(where + ": no host");
  // Each bracket (a range list) contributes its first number, zero padding kept.
  std::string host;
  for (size_t at = 0;;) {
    const size_t open = first.find('[', at);
    if (open == std::string::npos) return host + first.substr(at);
    const size_t close = first.find(']', open);
    if (close == std::string::npos) throw InvalidArgument(where + ": unbalanced '['");
    size_t stop = open + 1;
    while (stop < close && std::isdigit(static_cast<unsigned char>(first[stop]))) ++stop;
    if (stop == open + 1) throw InvalidArgument(where + ": expected a number after '['");
    host += first.substr(at, open - at) + first.substr(open + 1, stop - open - 1);
    at = close + 1;
  }
}

int slurm_tasks_on_node(const std::string& spec, int node) {
  const std::string what = "SLURM_STEP_TASKS_PER_NODE";
  int at = 0;
  for (size_t b = 0; b < spec.size();) {
    size_t e = spec.find(',', b);
    if (e == std::string::npos) e = spec.size();
    std::string item = spec.substr(b, e - b);
    long repeat = 1;
    if (const size_t p = item.find("(x"); p != std::string::npos) {
      // NOLINTNEXTLINE(performance-inefficient-string-concatenation): an error message, built once
      if (item.back() != ')') throw InvalidArgument(what + "='" + spec + "': bad repeat '" + item + "'");
      repeat = parse_count(item.substr(p + 2, item.size() - p - 3), what.c_str());
      item = item.substr(0, p);
    }
    const long tasks = parse_count(item, what.c_str());
    if (node < at + repeat) return static_cast<int>(tasks);
    at += static_cast<int>(repeat);
    b = e + 1;
  }
  throw InvalidArgument(detail::concat(what, "='", spec, "' names ", at, " node(s); this is node ", node));
}

SlurmStep read_slurm_step(const World& world) {
  SlurmStep s;
  s.world = world;
  const std::string nodes = env_or("SLURM_STEP_NUM_NODES", env_or("SLURM_NNODES", "1"));
  s.num_nodes = static_cast<int>(parse_count(nodes, "SLURM_STEP_NUM_NODES"));
  if (s.num_nodes < 1) throw InvalidArgument("SLURM_STEP_NUM_NODES='" + nodes + "' must be at least 1");
  // SLURM_NTASKS_PER_NODE is set only when asked for; srun always sets the step's tasks per node.
  if (std::getenv("SLURM_NTASKS_PER_NODE") == nullptr) {
    const std::string per = env_or("SLURM_STEP_TASKS_PER_NODE", env_or("SLURM_TASKS_PER_NODE"));
    if (!per.empty())
      s.world.local_size = slurm_tasks_on_node(per, s.world.node_rank);
    else if (s.num_nodes == 1)
      s.world.local_size = s.world.size;
  }
  if (s.world.local_rank >= s.world.local_size)
    throw InvalidArgument(detail::concat("Slurm: SLURM_LOCALID=", s.world.local_rank, " but node ", s.world.node_rank,
                                         " has ", s.world.local_size, " task(s)"));
  int port = 0;
  if (const std::string p = env_or("TESSERA_COORDINATOR_PORT"); !p.empty()) {
    port = static_cast<int>(parse_count(p, "TESSERA_COORDINATOR_PORT"));
    if (port < 1 || port > 65535) throw InvalidArgument("TESSERA_COORDINATOR_PORT='" + p + "' is not a port");
  } else {
    const long job = parse_count(env_or("SLURM_JOB_ID", "0"), "SLURM_JOB_ID");
    const long step = parse_count(env_or("SLURM_STEP_ID", "0"), "SLURM_STEP_ID");
    port = static_cast<int>(20000 + (job * 16 + step) % 20000);
  }
  std::string host = env_or("TESSERA_COORDINATOR_HOST");
  if (host.empty() && s.num_nodes == 1) host = "127.0.0.1";
  if (host.empty()) {
    const std::string list = env_or("SLURM_STEP_NODELIST", env_or("SLURM_JOB_NODELIST"));
    if (list.empty()) throw InvalidArgument("Slurm step on several nodes without SLURM_STEP_NODELIST");
    host = first_slurm_host(list);
  }
  s.coordinator = host + ":" + std::to_string(port);
  s.listen = (s.num_nodes == 1 ? "127.0.0.1:" : "0.0.0.0:") + std::to_string(port);
  s.token = env_or("TESSERA_JOB_TOKEN", "slurm-" + env_or("SLURM_JOB_ID", "0") + "." + env_or("SLURM_STEP_ID", "0"));
  return s;
}

}  // namespace tessera::launcher
