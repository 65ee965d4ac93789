// st_bench: safetensors write/read throughput against `cp` of the same file.
//
//   build/bin/st_bench [--mib 512] [--tensors 8] [--reps 3] [--dir DIR]
//
// Its files go to --dir (default $TMPDIR, else /tmp) as st_bench.<pid>.*.
//
// Writes --mib MiB of f32 tensors with write_safetensors (temp file, fsync,
// rename), then reads them back three ways: get() into new host tensors,
// read_into() preallocated tensors, and open+validate only. The page cache is
// warm for reads (the file was just written), as it is for cp. For reference it
// times `cp FILE COPY` (no fsync: what the brief compares against) and
// `cp FILE COPY && sync COPY`, which pays the same durability cost as our writer.
// Prints the best of --reps for each.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "parallel/checkpoint/safetensors.h"
#include "runtime/files.h"

namespace {

using Clock = std::chrono::steady_clock;

double best_of(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

void run(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::fprintf(stderr, "st_bench: '%s' failed (%d)\n", cmd.c_str(), rc);
    std::exit(1);
  }
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--mib N] [--tensors K] [--reps R] [--dir DIR]\n", argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 512, ntensors = 8;
  int reps = 3;
  std::string dir = tessera::temp_directory();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return usage(argv[0]);
    std::string v = argv[++i];
    try {
      if (a == "--mib") {
        mib = std::stoll(v);
      } else if (a == "--tensors") {
        ntensors = std::stoll(v);
      } else if (a == "--reps") {
        reps = std::stoi(v);
      } else if (a == "--dir") {
        dir = v;
      } else {
        return usage(argv[0]);
      }
    } catch (const std::exception&) {
      return usage(argv[0]);
    }
  }
  if (mib <= 0 || ntensors <= 0 || reps <= 0 || (mib << 20) % (ntensors * 4) != 0) return usage(argv[0]);

  using tessera::DType;
  using tessera::Tensor;
  const int64_t elems = (mib << 20) / 4 / ntensors;
  std::vector<std::pair<std::string, Tensor>> ts;
  for (int64_t i = 0; i < ntensors; ++i) {
    Tensor t = Tensor::empty({elems}, DType::F32);
    float* p = t.data<float>();
    for (int64_t k = 0; k < elems; ++k) p[k] = static_cast<float>(k ^ i);
    ts.emplace_back("t" + std::to_string(i), t);
  }
  const std::string file = dir + "/st_bench." + std::to_string(::getpid()) + ".safetensors";
  const std::string copy = file + ".cp";
  const double bytes = static_cast<double>(mib << 20);
  auto gbs = [&](double s) { return bytes / s / 1e9; };

  try {
    double w = best_of(reps, [&] { tessera::parallel::checkpoint::write_safetensors(file, ts, {{"format", "pt"}}); });
    double cp = best_of(reps, [&] { run("cp '" + file + "' '" + copy + "'"); });
    double cps = best_of(reps, [&] { run("cp '" + file + "' '" + copy + "' && sync '" + copy + "'"); });

    std::vector<Tensor> dst;
    dst.reserve(ts.size());
    for (const auto& nt : ts) dst.push_back(Tensor::empty(nt.second.shape(), DType::F32));
    double rget = best_of(reps, [&] {
      tessera::parallel::checkpoint::SafetensorsReader r(file);
      for (const auto& e : r.entries()) {
        Tensor t = r.get(e.name);
        if (t.nbytes() != e.end - e.begin) std::abort();
      }
    });
    double rinto = best_of(reps, [&] {
      tessera::parallel::checkpoint::SafetensorsReader r(file);
      for (size_t i = 0; i < ts.size(); ++i) r.read_into(ts[i].first, dst[i]);
    });
    double ropen = best_of(reps, [&] { tessera::parallel::checkpoint::SafetensorsReader r(file); });
    // Verify the last read.
    for (size_t i = 0; i < ts.size(); ++i) {
      if (std::memcmp(dst[i].raw_data(), ts[i].second.raw_data(), dst[i].nbytes()) != 0) {
        std::fprintf(stderr, "st_bench: read back differs for %s\n", ts[i].first.c_str());
        return 1;
      }
    }
    std::printf("st_bench: %lld MiB in %lld f32 tensors, best of %d, file %s\n", static_cast<long long>(mib),
                static_cast<long long>(ntensors), reps, file.c_str());
    std::printf("  write_safetensors (fsync+rename)  %7.3f s  %6.2f GB/s\n", w, gbs(w));
    std::printf("  cp FILE COPY                      %7.3f s  %6.2f GB/s\n", cp, gbs(cp));
    std::printf("  cp FILE COPY && sync COPY         %7.3f s  %6.2f GB/s\n", cps, gbs(cps));
    std::printf("  read: open + get() all            %7.3f s  %6.2f GB/s\n", rget, gbs(rget));
    std::printf("  read: open + read_into() all      %7.3f s  %6.2f GB/s\n", rinto, gbs(rinto));
    std::printf("  read: open + validate only        %7.3f s\n", ropen);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "st_bench: %s\n", e.what());
    std::filesystem::remove(file);
    std::filesystem::remove(copy);
    return 1;
  }
  std::filesystem::remove(file);
  std::filesystem::remove(copy);
  return 0;
}
