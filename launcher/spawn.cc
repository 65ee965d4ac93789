#include "launcher/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "runtime/cpu_rotation.h"
#include "runtime/env.h"
#include "runtime/error.h"

extern char** environ;

namespace tessera::launcher {

namespace {

bool set_by_tessera(const char* kv) {
  static const char* names[] = {"TESSERA_RANK=",
                                "TESSERA_WORLD_SIZE=",
                                "TESSERA_LOCAL_RANK=",
                                "TESSERA_LOCAL_SIZE=",
                                "TESSERA_NODE_RANK=",
                                "TESSERA_NUM_NODES=",
                                "TESSERA_COORDINATOR=",
                                "TESSERA_COORDINATOR_LOCAL=",
                                "TESSERA_JOB_TOKEN=",
                                "TESSERA_HEARTBEAT_MS=",
                                "TESSERA_HOST=",
                                "TESSERA_RESTART_COUNT=",
                                "RANK=",
                                "WORLD_SIZE=",
                                "LOCAL_RANK=",
                                "LOCAL_WORLD_SIZE=",
                                "GROUP_RANK=",
                                "MASTER_ADDR=",
                                "MASTER_PORT=",
                                "TORCHELASTIC_RESTART_COUNT=",
                                "TORCHELASTIC_MAX_RESTARTS=",
                                "TORCHELASTIC_RUN_ID=",
                                "ROLE_RANK=",
                                "ROLE_WORLD_SIZE=",
                                "GROUP_WORLD_SIZE=",
                                "ROLE_NAME=",
                                "TESSERA_BOUND_CPUS=",
                                "TORCHELASTIC_USE_AGENT_STORE="};
  for (const char* n : names)
    if (std::strncmp(kv, n, std::strlen(n)) == 0) return true;
  return false;
}

const std::string& keeper_path() {
  static const std::string path = beside_own_executable("tessera_keeper");
  return path;
}

}  // namespace

std::vector<std::string> worker_environment(const WorkerEnv& w) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (!set_by_tessera(*e)) env.emplace_back(*e);
  auto add = [&env](const std::string& k, const std::string& v) { env.push_back(k + "=" + v); };
  const std::string rank = std::to_string(w.rank), ws = std::to_string(w.world_size);
  const std::string lr = std::to_string(w.local_rank), ls = std::to_string(w.local_size);
  const std::string nr = std::to_string(w.node_rank), rc = std::to_string(w.restart_count);
  add("TESSERA_RANK", rank);
  add("TESSERA_WORLD_SIZE", ws);
  add("TESSERA_LOCAL_RANK", lr);
  add("TESSERA_LOCAL_SIZE", ls);
  add("TESSERA_NODE_RANK", nr);
  add("TESSERA_NUM_NODES", std::to_string(w.num_nodes));
  add("TESSERA_COORDINATOR", w.coordinator);
  if (!w.coordinator_local.empty()) add("TESSERA_COORDINATOR_LOCAL", w.coordinator_local);
  add("TESSERA_JOB_TOKEN", w.token);
  add("TESSERA_HEARTBEAT_MS", std::to_string(w.heartbeat_ms));
  add("TESSERA_HOST", w.host);
  add("TESSERA_RESTART_COUNT", rc);
  add("RANK", rank);
  add("WORLD_SIZE", ws);
  add("LOCAL_RANK", lr);
  add("LOCAL_WORLD_SIZE", ls);
  add("GROUP_RANK", nr);
  add("GROUP_WORLD_SIZE", std::to_string(w.num_nodes));
  add("ROLE_RANK", rank);
  add("ROLE_WORLD_SIZE", ws);
  add("MASTER_ADDR", w.master_addr);
  add("MASTER_PORT", std::to_string(w.master_port));
  add("TORCHELASTIC_RESTART_COUNT", rc);
  add("TORCHELASTIC_MAX_RESTARTS", std::to_string(w.max_restarts));
  add("TORCHELASTIC_RUN_ID", w.run_id);
  // As torchrun's LocalElasticAgent: one role, "default" (ROLE_RANK and
  // ROLE_WORLD_SIZE are then RANK and WORLD_SIZE); False because rank 0
  // hosts the store on MASTER_PORT itself (torch's env:// then makes rank 0
  // start a TCPStore there and the others connect).
  add("ROLE_NAME", "default");
  add("TORCHELASTIC_USE_AGENT_STORE", "False");
  // torchrun's defaults, each kept when the launcher's environment has it.
  if (!std::getenv("NCCL_ASYNC_ERROR_HANDLING")) add("NCCL_ASYNC_ERROR_HANDLING", "1");
  if (!std::getenv("OMP_NUM_THREADS") && w.local_size > 1) add("OMP_NUM_THREADS", "1");
  // The job's id, which every process of the job inherits (tests find them
  // by it in /proc/*/environ): the launcher's own when set, else the run id.
  if (!w.bound_cpus.empty()) add("TESSERA_BOUND_CPUS", w.bound_cpus);
  const char* job = std::getenv("TESSERA_JOB_ID");
  if (!job || !*job) add("TESSERA_JOB_ID", w.run_id);
  return env;
}

std::vector<int> worker_cpus(int nproc) {
  if (env_or("TESSERA_BIND") == "0") return {};
  const std::vector<int> cpus = current_cpu_mask();
  if (nproc < 2 || nproc > static_cast<int>(cpus.size())) return {};
  std::vector<int> out;
  out.reserve(static_cast<size_t>(nproc));
  for (int i = 0; i < nproc; ++i) out.push_back(cpus[static_cast<size_t>(i) % cpus.size()]);
  return out;
}

std::string own_executable() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot resolve /proc/self/exe: " + ec.message());
  return p.string();
}

std::string beside_own_executable(const std::string& name) {
  return (std::filesystem::path(own_executable()).parent_path() / name).string();
}

SpawnedWorker spawn_worker(const std::string& program, const std::vector<std::string>& args,
                           const std::vector<std::string>& env, int stdin_fd, int cpu, bool inherit_output) {
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  auto close_all = [&] {
    for (int fd : {out[0], out[1], err[0], err[1]})
      if (fd >= 0) close(fd);
  };
  if (!inherit_output && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)) {
    int e = errno;
    close_all();
    throw Error(detail::concat("pipe: ", std::strerror(e)));
  }
  // tessera_keeper LAUNCHER_PID CPU PROGRAM ARGV0 [ARG...], in the worker's environment.
  // posix_spawn takes char* const[] and writes through none of them.
  const std::string& keeper = keeper_path();
  const std::string launcher = std::to_string(getpid()), cpu_arg = std::to_string(cpu);
  std::vector<char*> argv, envp;
  argv.reserve(args.size() + 5);
  for (const std::string* s : {&keeper, &launcher, &cpu_arg, &program}) argv.push_back(const_cast<char*>(s->c_str()));
  for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  envp.reserve(env.size() + 1);
  for (const auto& s : env) envp.push_back(const_cast<char*>(s.c_str()));
  envp.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  if (stdin_fd > 0) posix_spawn_file_actions_adddup2(&fa, stdin_fd, 0);
  if (!inherit_output) {
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  }
  // Its own process group (before exec, so a signal sent right after finds
  // the group), every signal blocked (keeper_main.cc).
  sigset_t all;
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, keeper.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    close_all();
    throw Error(detail::concat("cannot start ", keeper, ": ", std::strerror(rc),
                               " (tessera_keeper is built and installed beside tessera)"));
  }
  for (int* fd : {&out[1], &err[1]})
    if (*fd >= 0) close(*fd), *fd = -1;
  if (!inherit_output) {
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
  }
  return SpawnedWorker{pid, out[0], err[0]};
}

}  // namespace tessera::launcher
