// `tessera ckpt`: inspect, shard, reshard, consolidate and verify
// checkpoints of any model (the work is in parallel/checkpoint/ckpt_tool.h,
// the model families in parallel/models/families.h; this file is flags and
// printing).
#include "launcher/ckpt_cli.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <vector>

#include "parallel/checkpoint/ckpt_tool.h"
#include "parallel/models/families.h"
#include "parallel/pipeline/partition.h"
#include "runtime/error.h"

namespace tessera::launcher {

namespace {

namespace fs = std::filesystem;
namespace ckpt = parallel::checkpoint;

struct CkptArgs {
  std::string path, out;
  int tp = 1, pp = 1, dp = 0;  // dp 0: 1 for shard, the checkpoint's own for reshard
  int64_t heads = 0;
  std::string stages;          // "3,3,2,2"; empty: parallel::pipeline::stage_layers
  std::string max_shard_size;  // consolidate: Hugging Face sharded form when set
  bool allow_nonfinite = false;
  bool with_optimizer = false;  // consolidate of a training checkpoint
};

ckpt::ShardOptions shard_options(const CkptArgs& a) {
  ckpt::ShardOptions o;
  o.tp = a.tp;
  o.pp = a.pp;
  o.dp = a.dp;
  o.heads = a.heads;
  o.stages = a.stages.empty() ? std::vector<int>{} : parallel::pipeline::parse_stages(a.stages);
  o.allow_nonfinite = a.allow_nonfinite;
  return o;
}

std::string mib(uint64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  return buf;
}

int inspect_checkpoint(const ckpt::Input& in) {
  const ckpt::Checkpoint& ck = *in.ck;
  const ckpt::Layout& l = ck.layout();
  std::printf("%s: tessera checkpoint (%s), step %lld, run %s\n", ck.dir().c_str(),
              ck.has_trainer_state() ? "training state" : "weights only", static_cast<long long>(ck.step()),
              ck.run_id().empty() ? "-" : ck.run_id().c_str());
  std::printf("layout: tp=%d dp=%d pp=%d stages=%s zero1=%s sequence_parallel=%s\n", l.tp, l.dp, l.pp,
              l.stages.empty() ? "-" : parallel::pipeline::stages_str(l.stages).c_str(), l.zero1 ? "yes" : "no",
              l.sequence_parallel ? "yes" : "no");
  std::printf("model: %s\n  %s\n", in.model->describe().c_str(), ck.model_json().c_str());
  const bool moments = ck.has_kind(ckpt::StateKind::ExpAvg);
  std::printf("tensors (%zu%s):\n", ck.tensors().size(), moments ? "; param, exp_avg and exp_avg_sq each" : "");
  uint64_t elems = 0;
  for (const auto& [name, t] : ck.tensors()) {
    const int64_t n = shape_numel(t.shape);
    elems += static_cast<uint64_t>(n);
    std::printf("  %-44s %-5s %-16s %lld\n", name.c_str(), dtype_name(t.dtype), shape_str(t.shape).c_str(),
                static_cast<long long>(n) * static_cast<long long>(dtype_size(t.dtype)));
  }
  uint64_t bytes = 0;
  std::printf("files (%zu):\n", ck.files().size());
  for (size_t i = 0; i < ck.files().size(); ++i) {
    const ckpt::FileInfo& f = ck.files()[i];
    size_t pieces = 0;
    for (const ckpt::PieceInfo& p : ck.pieces()) pieces += p.file == i;
    bytes += f.bytes;
    std::printf("  %-52s rank %-4d %8llu bytes  %zu pieces  sha256 %s\n", f.name.c_str(), f.rank,
                static_cast<unsigned long long>(f.bytes), pieces, f.sha256.c_str());
  }
  std::printf("total: %llu parameters, %s in %zu files (every hash checked)\n", static_cast<unsigned long long>(elems),
              mib(bytes).c_str(), ck.files().size());
  return 0;
}

int run_inspect(const CkptArgs& a, const ckpt::ModelFamilies& f) {
  if (ckpt::resolve_checkpoint(a.path)) return inspect_checkpoint(ckpt::open_input(a.path, f, a.heads));
  std::unique_ptr<ckpt::TensorSource> src = ckpt::open_safetensors(a.path);
  std::printf("%s: %zu tensors\n", src->path().c_str(), src->names().size());
  uint64_t total = 0;
  for (const std::string& name : src->names()) {
    const ckpt::SafetensorsEntry& e = src->entry(name);
    total += e.end - e.begin;
    std::printf("  %-44s %-5s %-16s %llu\n", name.c_str(), dtype_name(e.dtype), shape_str(e.shape).c_str(),
                static_cast<unsigned long long>(e.end - e.begin));
  }
  std::printf("metadata:\n");
  for (const auto& [k, v] : src->metadata()) std::printf("  %s = %s\n", k.c_str(), v.c_str());
  std::printf("total tensor data: %s (%llu bytes)\n", mib(total).c_str(), static_cast<unsigned long long>(total));
  // What is wrong goes to stderr, and the exit code is 2 (bad input), as
  // every other subcommand says of a file it cannot use; the listing above
  // stays on stdout.
  std::fflush(stdout);
  int code = 0;
  for (const std::string& p : ckpt::nonfinite_problems(*src)) {
    std::fprintf(stderr, "tessera ckpt inspect: non-finite: %s\n", p.c_str());
    code = tessera::launcher::cli::kUsageExit;
  }
  std::string invalid;
  try {
    const ckpt::HfModel m = f.from_hf(*src, a.heads);
    std::printf("model: %s\nvalid checkpoint of it\n", m.layout->describe().c_str());
  } catch (const FormatError& e) {
    invalid = e.what();
  } catch (const InvalidArgument& e) {
    invalid = e.what();
  }
  if (!invalid.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "tessera ckpt inspect: not a valid checkpoint of a model tessera knows: %s\n",
                 invalid.c_str());
    code = tessera::launcher::cli::kUsageExit;
  }
  return code;
}

// Runs `fn`, mapping bad input (flags or files) to `bad_exit` with the message.
template <typename Fn>
int guarded(const char* sub, Fn fn, int bad_exit = tessera::launcher::cli::kUsageExit) {
  try {
    return fn();
  } catch (const FormatError& e) {
    std::cerr << "tessera ckpt " << sub << ": " << e.what() << "\n";
    return bad_exit;
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
  cmd->add_option(
         "--heads", a->heads,
         "Hugging Face source without config.json: attention heads (default: the file's metadata, else hidden/64)")
      ->check(cli::positive(a->heads));
  cmd->add_flag("--allow-nonfinite", a->allow_nonfinite,
                "Accept NaN/Inf weights (default: an error naming the tensors)");
}

}  // namespace

void add_ckpt_command(CLI::App& root, tessera::launcher::cli::Action& action) {
  auto* ckpt = root.add_subcommand("ckpt", "Inspect, shard, reshard, consolidate and verify checkpoints");
  ckpt->require_subcommand(1);
  ckpt->footer(
      "Inputs: a checkpoint directory (train_gpt --save DIR/step_NNNNNNNN, or a `tessera ckpt shard` output), a "
      "--save directory (its newest complete checkpoint), a Hugging Face safetensors file, index or directory. "
      "Temporary files: OUT is built in .OUT.tmp-<pid> next to it; files inside go through .NAME.tmp.<pid>.XXXXXX. "
      "Removed when a run fails; a killed run's by the next run writing any output in that directory (its pid is "
      "dead).");
  auto args = std::make_shared<CkptArgs>();
  auto families = std::make_shared<ckpt::ModelFamilies>(parallel::models::model_families());

  auto* inspect = ckpt->add_subcommand("inspect", "List tensors, layout, files and the model of any input");
  inspect->add_option("path", args->path, "checkpoint directory, --save directory, safetensors file, HF index/dir")
      ->required();
  inspect->add_option("--heads", args->heads, "Attention heads (default: config.json, the file's metadata, hidden/64)")
      ->check(cli::positive(args->heads));
  inspect->callback([&action, args, families] {
    action = [args, families] { return guarded("inspect", [&] { return run_inspect(*args, *families); }); };
  });

  auto* shard = ckpt->add_subcommand(
      "shard", "Write the weights of any input as a checkpoint for tp x pp ranks (the format train_gpt --save writes)");
  add_layout_flags(shard, args.get());
  shard->add_option("--dp", args->dp, "Data-parallel degree (the replicas' files are written; default 1)")
      ->check(cli::positive(args->dp));
  shard->add_option("--out", args->out, "Output checkpoint directory (must not exist or be empty)")
      ->required()
      ->check(cli::not_a_flag());
  shard->add_option("src", args->path, "HF safetensors file, index or directory, or a checkpoint (or --save) directory")
      ->required();
  shard->callback([&action, args, families] {
    action = [args, families] {
      return guarded("shard", [&] {
        ckpt::ShardOptions o = shard_options(*args);
        if (o.dp == 0) o.dp = 1;
        const uint64_t b = ckpt::shard(args->path, args->out, o, *families);
        std::printf("wrote %s of weights for tp=%d pp=%d dp=%d to %s (%s, done marker last)\n", mib(b).c_str(), o.tp,
                    o.pp, o.dp, args->out.c_str(), ckpt::kManifestName);
        return 0;
      });
    };
  });

  auto* reshard = ckpt->add_subcommand(
      "reshard", "Any input for a new tp/pp/dp, keeping what it holds (a training checkpoint stays one)");
  add_layout_flags(reshard, args.get());
  reshard->add_option("--dp", args->dp, "Data-parallel degree (default: the checkpoint's own)")
      ->check(cli::positive(args->dp));
  reshard->add_option("--out", args->out, "Output directory (must not exist or be empty)")
      ->required()
      ->check(cli::not_a_flag());
  reshard
      ->add_option("src", args->path,
                   "A checkpoint (a training one is written as OUT/step_NNNNNNNN with its optimizer and trainer "
                   "state), a --save directory, or an HF file or directory")
      ->required();
  reshard->callback([&action, args, families] {
    action = [args, families] {
      return guarded("reshard", [&] {
        const std::string dir = ckpt::reshard(args->path, args->out, shard_options(*args), *families);
        std::printf("wrote checkpoint %s (tp=%d pp=%d) from %s\n", dir.c_str(), args->tp, args->pp, args->path.c_str());
        return 0;
      });
    };
  });

  auto* cons = ckpt->add_subcommand("consolidate", "Join any input's weights into one HF file (or an HF directory)");
  cons->add_option("--out", args->out, "Output .safetensors file (a directory with --max-shard-size)")
      ->required()
      ->check(cli::not_a_flag());
  cons->add_option("--max-shard-size", args->max_shard_size,
                   "Write the Hugging Face sharded form into --out (model-0000K-of-0000N.safetensors, "
                   "model.safetensors.index.json and config.json), at most this much tensor data per file, e.g. "
                   "500MB, 2GB, 1GiB");
  cons->add_option("src", args->path, "A checkpoint or --save directory (or an HF file or directory)")->required();
  cons->add_flag("--allow-nonfinite", args->allow_nonfinite,
                 "Accept NaN/Inf weights (default: an error naming the tensors)");
  cons->add_flag("--with-optimizer", args->with_optimizer,
                 "Also write the AdamW moments (optimizer.exp_avg.NAME, optimizer.exp_avg_sq.NAME) and any fp32 "
                 "master weights (optimizer.master.NAME)");
  cons->callback([&action, args, families] {
    action = [args, families] {
      return guarded("consolidate", [&] {
        uint64_t max = 0;
        if (!args->max_shard_size.empty()) {
          max = ckpt::parse_shard_size(args->max_shard_size);
        } else {
          cli::check_output_file("--out", args->out);
        }
        const std::vector<std::string> files =
            ckpt::consolidate_path(args->path, args->out, max, args->with_optimizer, args->allow_nonfinite, *families);
        if (max == 0)
          std::printf("wrote %s%s\n", args->out.c_str(), args->with_optimizer ? " (weights and AdamW moments)" : "");
        else
          std::printf("wrote %zu file%s%s and config.json to %s\n", files.size(), files.size() == 1 ? "" : "s",
                      files.size() == 1 ? "" : ", model.safetensors.index.json", args->out.c_str());
        return 0;
      });
    };
  });

  auto* verify = ckpt->add_subcommand(
      "verify",
      "Check a checkpoint: marker, manifest, model against the tensors, every file's size and SHA-256, every "
      "element stored exactly once (exit 1 naming the problem)");
  verify->add_option("dir", args->path, "Checkpoint directory (or a --save directory: its newest)")->required();
  verify->callback([&action, args, families] {
    action = [args, families] {
      return guarded(
          "verify",
          [&] {
            TESSERA_ARG_CHECK(ckpt::resolve_checkpoint(args->path).has_value(), args->path,
                              " is not a checkpoint directory, nor a --save directory holding a complete one");
            const ckpt::Input in = ckpt::open_input(args->path, *families);
            uint64_t bytes = 0;
            for (const ckpt::FileInfo& fi : in.ck->files()) bytes += fi.bytes;
            std::printf("%s: OK: step %lld, %s, %zu tensors, %zu files, %llu bytes checked\n", in.ck->dir().c_str(),
                        static_cast<long long>(in.ck->step()), in.model->describe().c_str(), in.ck->tensors().size(),
                        in.ck->files().size(), static_cast<unsigned long long>(bytes));
            return 0;
          },
          1);
    };
  });
}

}  // namespace tessera::launcher
