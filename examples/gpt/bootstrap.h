// Joining the job for train_gpt. The one place that knows how a worker
// finds its peers, so launcher/worker.h's init_worker can replace it in one
// edit: world from the environment (runtime/world.h); alone, no
// communicator; otherwise a FileStore in a directory the ranks of this host
// share (TESSERA_STORE_DIR, or /tmp/tessera-train-<job id> with the job id
// from the launcher's environment) and the world communicator over it.
#pragma once

#include <functional>
#include <memory>

#include "collectives/communicator.h"
#include "runtime/device.h"
#include "runtime/world.h"

namespace tessera::gpt {

struct Job {
  World world;
  Device* device = nullptr;                   // this rank's emulated core
  std::shared_ptr<coll::Communicator> comm;  // null when alone; charges `device` with modeled comm time
};

// Creates this rank's Device (preset `device_preset`), joins, runs body, leaves. An exception from body (or from joining) is
// printed with the rank and turns into exit code 1.
int run_job(const std::string& device_preset, const std::function<int(const Job&)>& body);

}  // namespace tessera::gpt
