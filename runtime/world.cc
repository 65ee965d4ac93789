#include "runtime/world.h"

#include <cstdlib>
#include <string>

#include "runtime/error.h"

namespace tessera {

const char* world_source_name(WorldSource s) {
  switch (s) {
    case WorldSource::Single:
      return "single process";
    case WorldSource::Tessera:
      return "tessera run";
    case WorldSource::OpenMPI:
      return "OpenMPI";
    case WorldSource::Torchrun:
      return "torchrun";
    case WorldSource::Slurm:
      return "Slurm";
  }
  return "?";
}

namespace {

struct Names {
  WorldSource source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
  const char* node_rank;  // may be nullptr
};

constexpr Names kSources[] = {
    {WorldSource::Tessera, "TESSERA_RANK", "TESSERA_WORLD_SIZE", "TESSERA_LOCAL_RANK", "TESSERA_LOCAL_SIZE",
     "TESSERA_NODE_RANK"},
    {WorldSource::OpenMPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     // OMPI_COMM_WORLD_NODE_RANK is a process's rank on its node, not the
     // node's index: derive the node from rank / local size instead.
     "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr},
    {WorldSource::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"},
    {WorldSource::Slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID"},
};

int parse_int(const char* name, const std::string& value) {
  // Slurm writes SLURM_NTASKS_PER_NODE as e.g. "4(x2)"; take the leading number.
  size_t pos = 0;
  long v = 0;
  try {
    v = std::stol(value, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  bool slurm_repeat = (pos > 0 && pos < value.size() && value[pos] == '(');
  if (pos == 0 || (pos != value.size() && !slurm_repeat) || v < 0 || v > 1 << 24) {
    throw InvalidArgument(
        detail::concat("environment variable ", name, "='", value, "' is not a non-negative integer"));
  }
  return static_cast<int>(v);
}

std::optional<int> get_int(const EnvLookup& env, const char* name) {
  if (!name) return std::nullopt;
  auto v = env(name);
  if (!v || v->empty()) return std::nullopt;
  return parse_int(name, *v);
}

}  // namespace

World discover_world(const EnvLookup& env) {
  for (const Names& n : kSources) {
    auto rank = get_int(env, n.rank);
    if (!rank) continue;
    World w;
    w.source = n.source;
    w.rank = *rank;
    auto size = get_int(env, n.size);
    if (!size) {
      throw InvalidArgument(
          detail::concat(world_source_name(n.source), " world: ", n.rank, " is set but ", n.size, " is not"));
    }
    w.size = *size;
    if (w.size < 1 || w.rank >= w.size) {
      throw InvalidArgument(detail::concat(world_source_name(n.source), " world: ", n.rank, "=", w.rank, " but ",
                                           n.size, "=", w.size, " (need 0 <= rank < size)"));
    }
    auto lrank = get_int(env, n.local_rank);
    auto lsize = get_int(env, n.local_size);
    if (lrank.has_value() != lsize.has_value() && n.source != WorldSource::Slurm) {
      throw InvalidArgument(detail::concat(world_source_name(n.source), " world: ", lrank ? n.local_rank : n.local_size,
                                           " is set but ", lrank ? n.local_size : n.local_rank, " is not"));
    }
    // Without local variables, assume one node; Slurm may give SLURM_LOCALID alone.
    w.local_rank = lrank.value_or(w.rank);
    w.local_size = lsize.value_or(w.size);
    if (w.local_size < 1 || w.local_rank >= w.local_size || w.local_size > w.size) {
      throw InvalidArgument(detail::concat(world_source_name(n.source), " world: ", n.local_rank, "=", w.local_rank,
                                           ", ", n.local_size, "=", w.local_size, ", ", n.size, "=", w.size,
                                           " are inconsistent (need local_rank < local_size <= size)"));
    }
    auto node = get_int(env, n.node_rank);
    w.node_rank = node.value_or(w.rank / w.local_size);
    return w;
  }
  return World{};
}

World discover_world() {
  return discover_world([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace tessera
