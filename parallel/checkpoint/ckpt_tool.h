// `tessera ckpt` as a library: split a Hugging Face GPT-2 safetensors
// checkpoint into one file per (tp, pp) rank, and join it back.
//
// Layout of a shard directory (docs/checkpoint.md):
//   <dir>/dp_rank_00_tp_rank_XX_pp_rank_YY.safetensors   one per (tp, pp) rank
//   <dir>/manifest.json                                  config, tp/pp, every tensor's full shape, split dim, ranges
// Each shard file holds exactly what TP rank XX of train_gpt holds for the
// tensors of pipeline stage YY (gpt2_layout.h), under the Hugging Face names,
// in the source file's dtype. DP replicas are identical, so only dp_rank 00
// is written (the manifest records dp).
//
// Writers build the whole directory in a temp sibling and rename it into
// place: a failure leaves no partial output. Functions are stateless and
// may run concurrently on different paths.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "parallel/checkpoint/hf_gpt2.h"

namespace tessera::parallel::checkpoint {

struct ShardOptions {
  // {tp, pp, dp, heads[, stages]} as before stages existed (a constructor, so
  // the four-value form leaves stages empty without a missing-initializer warning).
  ShardOptions(int tp_ = 1, int pp_ = 1, int dp_ = 1, int64_t heads_ = 0, std::vector<int> stages_ = {})
      : tp(tp_), pp(pp_), dp(dp_), heads(heads_), stages(std::move(stages_)) {}
  int tp, pp, dp;
  int64_t heads;                 // 0: from the file's metadata, else hidden / 64 (infer_gpt2_config)
  std::vector<int> stages;       // layers per pp stage; empty: pipeline::stage_layers (gpt2_stages)
  bool allow_nonfinite = false;  // else NaN/Inf weights are a FormatError naming the tensors
};

// "dp_rank_00_tp_rank_01_pp_rank_00" (NxD's naming).
std::string rank_stem(int dp_rank, int tp_rank, int pp_rank);
constexpr const char* kManifestName = "manifest.json";

// Shards the GPT-2 checkpoint `src` (a file, an HF index or a directory; see
// open_safetensors) into `out_dir`, which must not exist or be empty.
// Throws InvalidArgument for bad options (tp/pp/dp < 1, heads % tp != 0,
// layers < pp, stages that are not pp positive counts summing to the layers,
// existing non-empty out_dir) and FormatError naming the file
// for a bad checkpoint. Returns the bytes of tensor data written.
uint64_t shard_gpt2(const std::string& src, const std::string& out_dir, const ShardOptions& opt);

// Joins the shard directory `dir` back into one Hugging Face GPT-2 file
// (write_gpt2_safetensors; the original dtype per tensor). Every shard is
// checked against the manifest; replicated tensors must agree across TP
// ranks. Before any tensor is read, every shard file's size and SHA-256 are
// checked against the manifest and the manifest's entries against the layout
// (check order: names, sizes, config vs bytes, hashes). Refuses an existing
// out_file (InvalidArgument). Throws FormatError naming the file and the problem.
void consolidate_gpt2(const std::string& dir, const std::string& out_file, bool allow_nonfinite = false);

// The manifest and every shard file's presence, size and SHA-256 (what
// consolidate checks first); returns the config. FormatError naming the file.
Gpt2Config verify_shard_dir(const std::string& dir);

// consolidate_gpt2 into a temp file beside out_dir, then shard_gpt2 it
// (heads come from the manifest).
uint64_t reshard_gpt2(const std::string& dir, const std::string& out_dir, const ShardOptions& opt);

// The config recorded in a shard directory's manifest.
Gpt2Config read_manifest_config(const std::string& dir);

}  // namespace tessera::parallel::checkpoint
