#include "examples/gpt/bootstrap.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "collectives/store.h"
#include "runtime/error.h"

namespace tessera::gpt {

namespace {

std::string store_dir() {
  if (const char* d = std::getenv("TESSERA_STORE_DIR")) return d;
  for (const char* var : {"TESSERA_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID"}) {
    if (const char* v = std::getenv(var)) {
      std::string id = v;
      for (char& c : id)
        if (c == '/' || c == ' ') c = '_';
      return "/tmp/tessera-train-" + id;
    }
  }
  // Ranks started by one launcher process on this host share its pid.
  return "/tmp/tessera-train-ppid" + std::to_string(getppid());
}

}  // namespace

int run_job(const std::string& device_preset, const std::function<int(const Job&)>& body) {
  Job job;
  std::unique_ptr<Device> device;
  try {
    job.world = discover_world();
    device = std::make_unique<Device>(DeviceSpec::preset(device_preset), job.world.rank);
    job.device = device.get();
    if (job.world.size > 1) {
      auto store = coll::make_file_store(store_dir());
      coll::CommOptions opts;
      opts.device = job.device;
      job.comm = coll::Communicator::create(store, job.world.rank, job.world.size, opts);
    }
    int rc = body(job);
    if (job.comm) job.comm->barrier();
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[%d] train_gpt: %s\n", job.world.rank, e.what());
    if (job.comm) job.comm->abort(e.what());
    return 1;
  }
}

}  // namespace tessera::gpt
