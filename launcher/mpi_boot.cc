#include "launcher/mpi_boot.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>

#include "runtime/error.h"

// Defined when the binary links tessera_coll_mpi (which then loaded libmpi
// at start anyway): its bootstrap, with the state the rest of the binary
// uses, is taken instead of the module's. A weak reference does not pull
// the archive member in.
extern "C" const tessera::collectives::mpi::BootApi* tessera_mpi_boot_api() __attribute__((weak));

namespace tessera::launcher {

namespace {

// Set by the build: the module in this build tree.
#ifndef TESSERA_MPI_BOOT_MODULE
#define TESSERA_MPI_BOOT_MODULE "libtessera_mpi_boot.so"
#endif

std::atomic<const collectives::mpi::BootApi*> g_loaded{nullptr};

const collectives::mpi::BootApi* load() {
  if (tessera_mpi_boot_api) return tessera_mpi_boot_api();
  // RTLD_GLOBAL: OpenMPI dlopens its own components (mca_*.so), which refer
  // to libmpi's and libopen-pal's symbols through the global scope.
  std::string tried;
  void* handle = nullptr;
  for (const char* path : {TESSERA_MPI_BOOT_MODULE, "libtessera_mpi_boot.so"}) {
    handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (handle) break;
    const char* why = dlerror();
    tried += detail::concat(tried.empty() ? "" : "; ", path, ": ", why ? why : "unknown error");
  }
  if (!handle)
    throw Error(detail::concat("cannot load the MPI bootstrap module (", tried,
                               "); build the target tessera_mpi_boot, or put its directory on LD_LIBRARY_PATH"));
  using Fn = const collectives::mpi::BootApi* (*)();
  auto fn = reinterpret_cast<Fn>(dlsym(handle, "tessera_mpi_boot_api"));
  if (!fn) throw Error("the MPI bootstrap module has no tessera_mpi_boot_api: not tessera's");
  const collectives::mpi::BootApi* api = fn();
  if (!api || api->version != collectives::mpi::kBootApiVersion)
    throw Error(detail::concat("the MPI bootstrap module is of another tessera build (table version ",
                               api ? api->version : -1, ", expected ", collectives::mpi::kBootApiVersion, ")"));
  return api;
}

}  // namespace

const collectives::mpi::BootApi& mpi_boot() {
  static std::mutex mu;
  if (const auto* api = g_loaded.load()) return *api;
  std::lock_guard<std::mutex> l(mu);
  if (!g_loaded.load()) g_loaded = load();
  return *g_loaded.load();
}

void mpi_abort_or_exit(int code) {
  if (const auto* api = g_loaded.load()) api->abort(code);
  _exit(code);
}

}  // namespace tessera::launcher
