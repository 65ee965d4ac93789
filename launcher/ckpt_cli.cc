// `tessera ckpt`: inspect, shard, consolidate and reshard GPT-2 checkpoints
// (the work is in parallel/checkpoint/ckpt_tool.h; this file is flags and printing).
#include "launcher/ckpt_cli.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <vector>

#include "launcher/train_ckpt_cli.h"
#include "parallel/checkpoint/ckpt_tool.h"
#include "parallel/checkpoint/hf_gpt2.h"
#include "parallel/checkpoint/train_ckpt.h"
#include "parallel/pipeline/partition.h"
#include "runtime/error.h"

namespace tessera::launcher {

namespace {

namespace fs = std::filesystem;

struct CkptArgs {
  std::string path, out;
  int tp = 1, pp = 1, dp = 1;
  int64_t heads = 0;
  std::string stages;          // "3,3,2,2"; empty: parallel::pipeline::stage_layers
  std::string max_shard_size;  // consolidate: Hugging Face sharded form when set
  bool allow_nonfinite = false;
  bool with_optimizer = false;  // consolidate of a training checkpoint
};

std::vector<int> stages_of(const CkptArgs& a) {
  return a.stages.empty() ? std::vector<int>{} : parallel::pipeline::parse_stages(a.stages);
}

std::string mib(uint64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  return buf;
}

uint64_t print_tensors(const parallel::checkpoint::TensorSource& src) {
  uint64_t total = 0;
  for (const std::string& name : src.names()) {
    const parallel::checkpoint::SafetensorsEntry& e = src.entry(name);
    total += e.end - e.begin;
    std::printf("  %-44s %-5s %-16s %llu\n", name.c_str(), dtype_name(e.dtype), shape_str(e.shape).c_str(),
                static_cast<unsigned long long>(e.end - e.begin));
  }
  return total;
}

int run_inspect(const CkptArgs& a) {
  if (is_train_ckpt_path(a.path)) return run_train_inspect(a.path);
  if (fs::is_directory(a.path) && fs::exists(fs::path(a.path) / parallel::checkpoint::kManifestName)) {
    // Sizes and SHA-256 of every shard file first: a damaged directory is an error, not a listing.
    parallel::checkpoint::Gpt2Config c = parallel::checkpoint::verify_shard_dir(a.path);
    std::printf("%s: tessera shard directory, GPT-2 %s\n", a.path.c_str(),
                parallel::checkpoint::gpt2_config_str(c).c_str());
    uint64_t total = 0;
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(a.path))
      if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      parallel::checkpoint::SafetensorsReader r(file.string());
      std::printf("%s (tp_rank %s, pp_rank %s):\n", file.filename().c_str(),
                  r.metadata().count("tp_rank") ? r.metadata().at("tp_rank").c_str() : "?",
                  r.metadata().count("pp_rank") ? r.metadata().at("pp_rank").c_str() : "?");
      total += print_tensors(r);
    }
    std::printf("total tensor data: %s; layout in %s\n", mib(total).c_str(),
                (fs::path(a.path) / parallel::checkpoint::kManifestName).c_str());
    return 0;
  }
  std::unique_ptr<parallel::checkpoint::TensorSource> src = parallel::checkpoint::open_safetensors(a.path);
  std::printf("%s: %zu tensors\n", src->path().c_str(), src->names().size());
  const uint64_t total = print_tensors(*src);
  std::printf("metadata:\n");
  for (const auto& [k, v] : src->metadata()) std::printf("  %s = %s\n", k.c_str(), v.c_str());
  std::printf("total tensor data: %s (%llu bytes)\n", mib(total).c_str(), static_cast<unsigned long long>(total));
  for (const std::string& p : parallel::checkpoint::nonfinite_problems(*src))
    std::printf("non-finite: %s\n", p.c_str());
  try {
    parallel::checkpoint::Gpt2Config c = parallel::checkpoint::infer_gpt2_config(*src, a.heads);
    std::vector<std::string> problems = parallel::checkpoint::gpt2_problems(*src, c);
    std::printf("GPT-2 config: %s\n", parallel::checkpoint::gpt2_config_str(c).c_str());
    if (problems.empty()) {
      std::printf("valid GPT-2 checkpoint\n");
    } else {
      std::printf("not a valid GPT-2 checkpoint:\n");
      for (const auto& p : problems) std::printf("  %s\n", p.c_str());
    }
  } catch (const FormatError& e) {
    std::printf("not a GPT-2 checkpoint: %s\n", e.what());
  }
  return 0;
}

// Runs `fn`, mapping bad input (flags or files) to exit 2 with the message.
template <typename Fn>
int guarded(const char* sub, Fn fn) {
  try {
    return fn();
  } catch (const FormatError& e) {
    std::cerr << "tessera ckpt " << sub << ": " << e.what() << "\n";
    return tessera::launcher::cli::kUsageExit;
  } catch (const InvalidArgument& e) {
    std::cerr << "tessera ckpt " << sub << ": " << e.what() << "\n";
    return tessera::launcher::cli::kUsageExit;
  }
}

void add_layout_flags(CLI::App* cmd, CkptArgs* a) {
  cmd->add_option("--tp", a->tp, "Tensor-parallel degree")->required()->check(cli::positive(a->tp));
  cmd->add_option("--pp", a->pp, "Pipeline stages (whole layers per stage)")
      ->capture_default_str()
      ->check(cli::positive(a->pp));
  cmd->add_option("--stages", a->stages,
                  "Layers per pp stage, e.g. 3,3,2,2 (default: even, leftover layers to the later stages)");
}

}  // namespace

void add_ckpt_command(CLI::App& root, tessera::launcher::cli::Action& action) {
  auto* ckpt = root.add_subcommand("ckpt", "Inspect, shard, consolidate and reshard GPT-2 checkpoints");
  ckpt->require_subcommand(1);
  ckpt->footer(
      "Temporary files: shard and reshard build OUT in .OUT.tmp-<pid> next to it, consolidate in "
      ".OUT.consolidated.tmp-<pid>; files inside go through .NAME.tmp.<pid>.XXXXXX. Removed when a run fails; "
      "a killed run's by the next run writing the same OUT (its pid is dead).");
  auto args = std::make_shared<CkptArgs>();

  auto* inspect = ckpt->add_subcommand("inspect", "List tensors, metadata and the inferred GPT-2 config");
  inspect->add_option("path", args->path, "safetensors file, HF index/dir, or shard dir")->required();
  inspect->add_option("--heads", args->heads, "Attention heads (default: metadata n_head, else hidden/64)")
      ->check(cli::positive(args->heads));
  inspect->callback(
      [&action, args] { action = [args] { return guarded("inspect", [&] { return run_inspect(*args); }); }; });

  auto* shard = ckpt->add_subcommand(
      "shard", "Split an HF GPT-2 checkpoint (or a training checkpoint's weights) into one file per (tp, pp) rank");
  add_layout_flags(shard, args.get());
  shard->add_option("--dp", args->dp, "Data-parallel degree (recorded; replicas are identical)")
      ->capture_default_str()
      ->check(cli::positive(args->dp));
  shard->add_option("--heads", args->heads, "Attention heads (default: metadata n_head, else hidden/64)")
      ->check(cli::positive(args->heads));
  shard->add_option("--out", args->out, "Output directory (must not exist or be empty)")->required();
  shard
      ->add_option("file", args->path,
                   "HF GPT-2 safetensors file, index or directory, or a training checkpoint (train_gpt --save: a "
                   "step directory, or the --save directory for its newest)")
      ->required();
  shard->add_flag("--allow-nonfinite", args->allow_nonfinite,
                  "Accept NaN/Inf weights (default: an error naming the tensors)");
  shard->callback([&action, args] {
    action = [args] {
      return guarded("shard", [&] {
        parallel::checkpoint::ShardOptions o{args->tp, args->pp, args->dp, args->heads, stages_of(*args)};
        o.allow_nonfinite = args->allow_nonfinite;
        uint64_t b = parallel::checkpoint::shard_gpt2(args->path, args->out, o);
        std::printf("wrote %d files (%s) and %s to %s\n", args->tp * args->pp, mib(b).c_str(),
                    parallel::checkpoint::kManifestName, args->out.c_str());
        return 0;
      });
    };
  });

  auto* cons = ckpt->add_subcommand("consolidate", "Join a shard directory back into one HF GPT-2 file");
  cons->add_option("--out", args->out, "Output .safetensors file (a directory with --max-shard-size)")->required();
  cons->add_option("--max-shard-size", args->max_shard_size,
                   "Write the Hugging Face sharded form into --out (model-0000K-of-0000N.safetensors and "
                   "model.safetensors.index.json), at most this much tensor data per file, e.g. 500MB, 2GB, 1GiB");
  cons->add_option("dir", args->path, "Shard directory (from `tessera ckpt shard`)")->required();
  cons->add_flag("--allow-nonfinite", args->allow_nonfinite,
                 "Accept NaN/Inf weights (default: an error naming the tensors)");
  cons->add_flag(
      "--with-optimizer", args->with_optimizer,
      "Training checkpoint: also write the AdamW moments (optimizer.exp_avg.NAME, optimizer.exp_avg_sq.NAME)");
  cons->callback([&action, args] {
    action = [args] {
      return guarded("consolidate", [&] {
        if (!args->max_shard_size.empty()) {
          const uint64_t max = parallel::checkpoint::parse_shard_size(args->max_shard_size);
          std::vector<std::string> files =
              parallel::checkpoint::consolidate_gpt2_sharded(args->path, args->out, max, args->allow_nonfinite);
          std::printf("wrote %zu file%s%s to %s\n", files.size(), files.size() == 1 ? "" : "s",
                      files.size() == 1 ? "" : " and model.safetensors.index.json", args->out.c_str());
          return 0;
        }
        cli::check_output_file("--out", args->out);
        // A step directory, or a --save directory (its newest complete step), as shard and reshard take.
        if (const auto step = parallel::checkpoint::resolve_train_checkpoint(args->path))
          return run_train_consolidate(*step, args->out, args->with_optimizer);
        parallel::checkpoint::consolidate_gpt2(args->path, args->out, args->allow_nonfinite);
        std::printf("wrote %s\n", args->out.c_str());
        return 0;
      });
    };
  });

  add_ckpt_verify_command(ckpt, action);

  auto* reshard = ckpt->add_subcommand(
      "reshard", "Shard a shard directory (or an HF checkpoint) for a new tp/pp; a training checkpoint stays one");
  add_layout_flags(reshard, args.get());
  reshard
      ->add_option("--dp", args->dp,
                   "Data-parallel degree (recorded; a training checkpoint is written for it, default its own)")
      ->capture_default_str()
      ->check(cli::positive(args->dp));
  reshard->add_option("--out", args->out, "Output directory (must not exist or be empty)")->required();
  reshard
      ->add_option("dir", args->path,
                   "Shard directory (from `tessera ckpt shard`), an HF file or sharded dir, or a training "
                   "checkpoint (written as OUT/step_NNNNNNNN in the new layout, with the optimizer state)")
      ->required();
  reshard->add_flag("--allow-nonfinite", args->allow_nonfinite,
                    "Accept NaN/Inf weights (default: an error naming the tensors)");
  reshard->callback([&action, args, reshard] {
    const bool dp_given = reshard->get_option("--dp")->count() > 0;
    action = [args, dp_given] {
      return guarded("reshard", [&] {
        if (parallel::checkpoint::resolve_train_checkpoint(args->path))
          return run_train_reshard(args->path, args->out, args->tp, args->pp, dp_given ? args->dp : 0, stages_of(*args),
                                   args->allow_nonfinite);
        parallel::checkpoint::ShardOptions o{args->tp, args->pp, args->dp, 0, stages_of(*args)};
        o.allow_nonfinite = args->allow_nonfinite;
        uint64_t b = parallel::checkpoint::reshard_gpt2(args->path, args->out, o);
        std::printf("wrote %d files (%s) and %s to %s\n", args->tp * args->pp, mib(b).c_str(),
                    parallel::checkpoint::kManifestName, args->out.c_str());
        return 0;
      });
    };
  });
}

}  // namespace tessera::launcher
