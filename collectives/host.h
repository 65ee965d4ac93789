// Host identity: which ranks of a communicator share a host.
//
// Shared memory works only between processes that see one another's process
// ids and memory, so "same host" here means: the same kernel boot (boot id)
// and the same PID, mount and IPC namespaces. Two machines never share a boot
// id; containers or network-namespace test hosts on one machine share the boot
// id but not their namespaces. The host name is carried for messages only.
// Nothing is inferred from LOCAL_WORLD_SIZE or from the launcher.
//
// exchange_hosts() is collective over a group: each rank publishes its
// identity under "host/<rank>" of the (already prefixed) store and reads
// everyone's. Thread-safe; no state.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "collectives/store.h"

namespace tessera::collectives {

struct HostIdentity {
  std::string key;   // boot id and namespace ids: equal keys mean "shared memory works"
  std::string name;  // host name (for messages)
  std::string cpus;  // the CPUs this process may run on (cpu_mask_hex())
};

// This process's identity (read from /proc each call). TESSERA_HOST_NAME
// overrides only the name shown in messages; TESSERA_HOST_KEY_SUFFIX is
// appended to the key (tests use it to make several "hosts" of one machine:
// it can split a host, never join two).
HostIdentity this_host();

// The CPUs this process may run on (its affinity: taskset, cpusets, an MPI
// binding), as hex digits, CPU 0 in the low bit of the first.
std::string cpu_mask_hex();
// Ors a mask of cpu_mask_hex() into `cpus` (one flag per CPU); false if it is not one.
bool add_cpu_mask(const std::string& hex, std::vector<bool>& cpus);

struct HostMap {
  std::vector<int> host_of;        // group rank -> host index (0, 1, ... in order of first rank)
  std::vector<std::string> names;  // host index -> host name
  std::vector<int> cpus;           // host index -> CPUs its ranks may run on (union of their affinities)
  int num_hosts() const { return static_cast<int>(names.size()); }
  // Host `h` has more of the group's ranks than CPUs for them: its ranks
  // take turns on its cores, so their work (a network stack's included)
  // does not overlap.
  bool crowded(int h) const;
  // Some host is crowded.
  bool crowded() const;
  // Group ranks on host `h`, ascending.
  std::vector<int> ranks_on(int h) const;
  // "host 'NAME'" of rank r, for messages.
  std::string describe(int r) const;
};

// Collective: publishes this rank's identity and reads the group's. Throws
// TimeoutError naming the rank that never published, InvalidArgument naming
// a rank whose identity does not parse.
HostMap exchange_hosts(Store& store, int rank, int size, std::chrono::milliseconds timeout);

}  // namespace tessera::collectives
