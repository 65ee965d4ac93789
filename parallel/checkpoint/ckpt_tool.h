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
// place: a failure leaves no partial output. Every command streams: tensors
// are read in pieces of at most 8 MiB (pread) and written through fixed
// buffers, each output file once, sequentially, its SHA-256 computed as it
// is written, so peak memory does not grow with the model (about 50 MiB for
// tp 8). Bytes are copied as stored (no dtype conversion). Functions are
// stateless and may run concurrently on different paths.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "parallel/checkpoint/hf_gpt2.h"
#include "parallel/checkpoint/train_ckpt.h"

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

// consolidate_gpt2, written in the Hugging Face sharded form into `out_dir`
// (must not exist or be empty; built in a temp sibling and renamed):
// model-0000K-of-0000N.safetensors holding the tensors in order, a new file
// whenever the next tensor would take this one past max_shard_bytes of
// tensor data (a larger tensor gets a file of its own), and
// model.safetensors.index.json {"metadata": {"total_size": data bytes},
// "weight_map": {name: file}}; when everything fits in one file, only
// model.safetensors (as transformers' save_pretrained). Returns the file
// names. Same checks and errors as consolidate_gpt2.
std::vector<std::string> consolidate_gpt2_sharded(const std::string& dir, const std::string& out_dir,
                                                  uint64_t max_shard_bytes, bool allow_nonfinite = false);

// "500MB", "2GB" (powers of 1000), "512MiB", "2GiB" (powers of 1024), a plain
// byte count: save_pretrained's max_shard_size. Throws InvalidArgument.
uint64_t parse_shard_size(const std::string& text);

// The shards of `dir` streamed straight into the new layout (tensor by
// tensor, in pieces; no consolidated copy), with every check consolidate
// makes first; heads come from the manifest. A `dir` without a manifest
// that is a Hugging Face file or sharded directory is sharded (shard_gpt2).
uint64_t reshard_gpt2(const std::string& dir, const std::string& out_dir, const ShardOptions& opt);

// reshard of a training checkpoint (train_gpt --save; `src` a step directory
// or a --save directory, whose newest complete checkpoint is taken): writes
// OUT/step_NNNNNNNN, a complete training checkpoint of the same run and
// step in ro.layout (relayout_train_checkpoint, train_ckpt.h), built in a
// temp sibling of OUT and renamed into place; `train_gpt --resume OUT`
// continues from it. OUT must not exist or be empty. Returns the step directory.
// reshard_gpt2 given a training checkpoint calls this with the checkpoint's
// layout changed to opt's tp, pp, dp and stages (its trainer state unchanged).
std::string reshard_train_checkpoint(const std::string& src, const std::string& out_dir, const RelayoutOptions& ro);

// The config recorded in a shard directory's manifest.
Gpt2Config read_manifest_config(const std::string& dir);

}  // namespace tessera::parallel::checkpoint
