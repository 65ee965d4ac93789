#include "examples/gpt/bootstrap.h"

#include "launcher/worker.h"

namespace tessera::gpt {

int run_job(const std::string& device_preset, const std::function<int(const Job&)>& body) {
  // The rank only names the device in messages; the launcher re-reads the world.
  const World w = discover_world();
  Device device(DeviceSpec::preset(device_preset), w.rank);
  launcher::WorkerOptions options;
  options.comm.device = &device;
  return launcher::run_worker(options, [&](launcher::WorkerContext& ctx) {
    Job job;
    job.world = ctx.world;
    job.device = &device;
    if (ctx.world.size > 1) job.comm = ctx.world_comm;
    return body(job);
  });
}

}  // namespace tessera::gpt
