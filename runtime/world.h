// World discovery: who am I in this job?
//
// Reads, in order of precedence, tessera's launcher variables (TESSERA_RANK,
// TESSERA_WORLD_SIZE, TESSERA_LOCAL_RANK, TESSERA_LOCAL_SIZE,
// TESSERA_NODE_RANK), OpenMPI's (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK,
// _LOCAL_SIZE), torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK) and Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
// SLURM_NTASKS_PER_NODE, SLURM_NODEID); with none set, a single process.
// A source is chosen by its rank variable; missing or inconsistent values
// (rank >= world size, non-numbers, ...) throw InvalidArgument naming the
// variables.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace tessera {

enum class WorldSource { Single, Tessera, OpenMPI, Torchrun, Slurm };
const char* world_source_name(WorldSource s);

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int node_rank = 0;
  WorldSource source = WorldSource::Single;
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Reads the process environment.
World discover_world();
// Reads through `env` (tests pass a map).
World discover_world(const EnvLookup& env);

}  // namespace tessera
