// `tessera ckpt inspect / verify / consolidate` for training checkpoints;
// the work is in parallel/checkpoint/train_ckpt.h, this file is flags and printing.
#include "launcher/train_ckpt_cli.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "parallel/checkpoint/ckpt_tool.h"
#include "parallel/checkpoint/train_ckpt.h"
#include "parallel/models/gpt/trainer_state.h"
#include "runtime/error.h"

namespace tessera::launcher {

namespace ckpt = parallel::checkpoint;
namespace fs = std::filesystem;

bool is_train_ckpt_path(const std::string& path) { return ckpt::is_train_checkpoint(path); }

int run_train_inspect(const std::string& dir) {
  ckpt::TrainCheckpoint ck(dir);
  const ckpt::TrainLayout& l = ck.layout();
  std::printf("%s: tessera training checkpoint, step %lld, run %s\n", ck.dir().c_str(),
              static_cast<long long>(ck.step()), ck.run_id().c_str());
  std::printf("layout: tp=%d dp=%d pp=%d zero1=%s sequence_parallel=%s\n", l.tp, l.dp, l.pp, l.zero1 ? "yes" : "no",
              l.sequence_parallel ? "yes" : "no");
  std::printf("model:");
  for (const auto& [k, v] : ck.model()) std::printf(" %s=%lld", k.c_str(), static_cast<long long>(v));
  std::printf("\ntensors (%zu; param, exp_avg and exp_avg_sq each):\n", ck.tensors().size());
  uint64_t elems = 0;
  for (const auto& [name, t] : ck.tensors()) {
    const int64_t n = shape_numel(t.shape);
    elems += static_cast<uint64_t>(n);
    std::printf("  %-44s F32   %-16s %lld\n", name.c_str(), shape_str(t.shape).c_str(), static_cast<long long>(n) * 4);
  }
  uint64_t bytes = 0;
  std::printf("files (%zu):\n", ck.files().size());
  for (const ckpt::FileInfo& f : ck.files()) {
    size_t pieces = 0;
    for (const ckpt::PieceInfo& p : ck.pieces()) pieces += p.file == static_cast<size_t>(&f - ck.files().data());
    bytes += f.bytes;
    std::printf("  %-52s rank %-4d %8llu bytes  %zu pieces  sha256 %s\n", f.name.c_str(), f.rank,
                static_cast<unsigned long long>(f.bytes), pieces, f.sha256.c_str());
  }
  std::printf("total: %llu parameters, %.2f MiB in %zu files (hashes not checked: tessera ckpt verify)\n",
              static_cast<unsigned long long>(elems), static_cast<double>(bytes) / (1024.0 * 1024.0),
              ck.files().size());
  return 0;
}

int run_train_consolidate(const std::string& dir, const std::string& out, bool with_optimizer) {
  ckpt::consolidate_train_checkpoint(dir, out, with_optimizer);
  std::printf("wrote %s%s\n", out.c_str(), with_optimizer ? " (weights and AdamW moments)" : "");
  return 0;
}

int run_train_reshard(const std::string& src, const std::string& out, int tp, int pp, int dp,
                      const std::vector<int>& stages, bool allow_nonfinite) {
  const std::optional<std::string> dir = ckpt::resolve_train_checkpoint(src);
  TESSERA_ARG_CHECK(dir.has_value(), src, " holds no complete training checkpoint");
  ckpt::RelayoutOptions ro;
  std::string state;
  {
    const ckpt::TrainCheckpoint ck(*dir);
    ro.layout = ck.layout();
    state = ck.read_trainer_state();  // size and hash checked
  }
  ro.layout.tp = tp;
  ro.layout.pp = pp;
  if (dp > 0) ro.layout.dp = dp;
  ro.stages = stages;
  ro.allow_nonfinite = allow_nonfinite;
  // The trainer state records the layout it was saved under: the new one.
  parallel::models::gpt::TrainerState st = parallel::models::gpt::decode_trainer_state(state, "checkpoint " + *dir);
  st.tp = ro.layout.tp;
  st.dp = ro.layout.dp;
  st.pp = ro.layout.pp;
  ro.trainer_state = parallel::models::gpt::encode_trainer_state(st);
  const std::string step_dir = ckpt::reshard_train_checkpoint(*dir, out, ro);
  std::printf("wrote training checkpoint %s (tp=%d dp=%d pp=%d) from %s\n", step_dir.c_str(), ro.layout.tp,
              ro.layout.dp, ro.layout.pp, dir->c_str());
  return 0;
}

void add_ckpt_verify_command(CLI::App* parent, tessera::launcher::cli::Action& action) {
  auto path = std::make_shared<std::string>();
  auto* verify = parent->add_subcommand(
      "verify", "Check every file's size and SHA-256 and that every tensor element is stored exactly once");
  verify->add_option("dir", *path, "Training checkpoint (train_gpt --save) or shard directory")->required();
  verify->callback([&action, path] {
    action = [path] {
      try {
        if (ckpt::is_train_checkpoint(*path)) {
          ckpt::TrainCheckpoint ck(*path);
          const uint64_t bytes = ck.verify_all();
          std::printf("%s: OK: step %lld, %zu tensors, %zu files, %llu bytes checked\n", ck.dir().c_str(),
                      static_cast<long long>(ck.step()), ck.tensors().size(), ck.files().size(),
                      static_cast<unsigned long long>(bytes));
        } else {
          ckpt::Gpt2Config c = ckpt::verify_shard_dir(*path);
          std::printf("%s: OK: shard directory, GPT-2 %s\n", path->c_str(), ckpt::gpt2_config_str(c).c_str());
        }
        return 0;
      } catch (const FormatError& e) {
        std::cerr << "tessera ckpt verify: " << e.what() << "\n";
        return 1;
      } catch (const InvalidArgument& e) {
        std::cerr << "tessera ckpt verify: " << e.what() << "\n";
        return cli::kUsageExit;
      }
    };
  });
}

}  // namespace tessera::launcher
