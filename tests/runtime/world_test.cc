#include "runtime/world.h"

#include <gtest/gtest.h>

#include <map>
#include <utility>

#include "runtime/error.h"

using namespace tessera;

namespace {
EnvLookup env_of(std::map<std::string, std::string> m) {
  return [m = std::move(m)](const std::string& k) -> std::optional<std::string> {
    auto it = m.find(k);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
}
}  // namespace

TEST(World, SingleProcessWhenNothingIsSet) {
  World w = discover_world(env_of({}));
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.size, 1);
  EXPECT_EQ(w.source, WorldSource::Single);
}

TEST(World, Tessera) {
  World w = discover_world(env_of({{"TESSERA_RANK", "5"},
                                   {"TESSERA_WORLD_SIZE", "8"},
                                   {"TESSERA_LOCAL_RANK", "1"},
                                   {"TESSERA_LOCAL_SIZE", "4"},
                                   {"TESSERA_NODE_RANK", "1"},
                                   {"OMPI_COMM_WORLD_RANK", "0"},
                                   {"OMPI_COMM_WORLD_SIZE", "1"}}));
  EXPECT_EQ(w.source, WorldSource::Tessera);  // tessera's variables win
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_size, 4);
  EXPECT_EQ(w.node_rank, 1);
}

TEST(World, OpenMPI) {
  World w = discover_world(env_of({{"OMPI_COMM_WORLD_RANK", "3"},
                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                   {"RANK", "0"},
                                   {"WORLD_SIZE", "1"}}));
  EXPECT_EQ(w.source, WorldSource::OpenMPI);
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.node_rank, 1);  // derived: rank / local_size
}

TEST(World, Torchrun) {
  World w = discover_world(env_of(
      {{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"}}));
  EXPECT_EQ(w.source, WorldSource::Torchrun);
  EXPECT_EQ(w.rank, 2);
  EXPECT_EQ(w.node_rank, 1);
}

TEST(World, Slurm) {
  World w = discover_world(env_of({{"SLURM_PROCID", "6"},
                                   {"SLURM_NTASKS", "8"},
                                   {"SLURM_LOCALID", "2"},
                                   {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                                   {"SLURM_NODEID", "1"}}));
  EXPECT_EQ(w.source, WorldSource::Slurm);
  EXPECT_EQ(w.rank, 6);
  EXPECT_EQ(w.size, 8);
  EXPECT_EQ(w.local_rank, 2);
  EXPECT_EQ(w.local_size, 4);
  EXPECT_EQ(w.node_rank, 1);
}

TEST(World, InconsistentValuesAreClearErrors) {
  EXPECT_THROW(discover_world(env_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}})), InvalidArgument);
  EXPECT_THROW(discover_world(env_of({{"RANK", "1"}})), InvalidArgument);
  EXPECT_THROW(discover_world(env_of({{"RANK", "x"}, {"WORLD_SIZE", "4"}})), InvalidArgument);
  EXPECT_THROW(discover_world(env_of({{"TESSERA_RANK", "0"},
                                      {"TESSERA_WORLD_SIZE", "2"},
                                      {"TESSERA_LOCAL_RANK", "3"},
                                      {"TESSERA_LOCAL_SIZE", "2"}})),
               InvalidArgument);
  try {
    discover_world(env_of({{"OMPI_COMM_WORLD_RANK", "9"}, {"OMPI_COMM_WORLD_SIZE", "4"}}));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_RANK=9"), std::string::npos) << e.what();
  }
}
