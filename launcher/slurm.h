// A job step started by Slurm's srun: what a rank needs to find the others
// (docs/launcher.md, "srun"). Pure functions over the environment.
#pragma once

#include <string>

#include "runtime/world.h"

namespace tessera::launcher {

// The first host of a Slurm host list: "node[07-09,12],gpu1" -> "node07".
// Throws InvalidArgument for an empty or malformed list.
std::string first_slurm_host(const std::string& nodelist);

// Tasks on node `node` of a Slurm tasks-per-node list ("4", "2(x3),1").
// Throws InvalidArgument when malformed or too short.
int slurm_tasks_on_node(const std::string& spec, int node);

struct SlurmStep {
  World world;              // SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, tasks on this node
  int num_nodes = 1;        // SLURM_STEP_NUM_NODES (or SLURM_NNODES)
  std::string coordinator;  // HOST:PORT rank 0 serves the coordinator on
  std::string listen;       // what rank 0 listens on: 127.0.0.1:PORT on one node, else 0.0.0.0:PORT
  std::string token;        // TESSERA_JOB_TOKEN, else derived from the job and step ids (not secret)
};

// HOST: TESSERA_COORDINATOR_HOST, else 127.0.0.1 on one node, else the first
// host of SLURM_STEP_NODELIST (SLURM_JOB_NODELIST). PORT:
// TESSERA_COORDINATOR_PORT, else 20000 + (SLURM_JOB_ID * 16 + SLURM_STEP_ID)
// mod 20000, the same for every rank of the step and different for steps
// running at once. Throws InvalidArgument naming the variable at fault.
SlurmStep read_slurm_step(const World& world);

}  // namespace tessera::launcher
