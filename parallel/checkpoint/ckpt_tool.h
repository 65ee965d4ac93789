// `tessera ckpt` as a library, for any model: inputs of every kind (a
// checkpoint directory, a --save directory, a Hugging Face file or sharded
// directory) opened and checked before a byte is used, then the one writer
// (write_checkpoint) and the one consolidate (checkpoint.h). The model
// families supply what depends on the model (ModelFamilies, implemented in
// parallel/models/), so this layer names no model.
//
// shard: a checkpoint of the weights only (no moments, no trainer state,
// step 0) in the new layout; reshard: the same, keeping what the source
// holds (a training checkpoint's moments, step, run and trainer state).
// Offline reshard and reshard on load are one code path
// (Checkpoint::read). Functions are stateless and may run concurrently on
// different paths.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/safetensors.h"

namespace tessera::parallel::checkpoint {

// A Hugging Face file as a model family reads it: its layout, and each
// descriptor name's stored name (the family's lenient reading).
struct HfModel {
  std::unique_ptr<ModelLayout> layout;
  std::map<std::string, std::string> stored;
};

struct ModelFamilies {
  // The layout of a manifest's model description.
  LayoutFactory layout;
  // The model of a Hugging Face source (config.json beside it when present,
  // else inferred from the tensors; heads_hint > 0: the head count when it
  // cannot be seen). FormatError listing every problem of the file.
  std::function<HfModel(const TensorSource& src, int64_t heads_hint)> from_hf;
  // A training checkpoint's trainer state with its recorded layout set to
  // `layout` (reshard); empty function: copied unchanged.
  std::function<std::string(const std::string& state, const Layout& layout, const std::string& where)> relayout_state;
};

// An input opened and checked: a checkpoint (marker, manifest, model
// against its layout, every file's size and SHA-256) or a Hugging Face
// source (the family's checks of every tensor).
struct Input {
  std::string where;
  std::unique_ptr<Checkpoint> ck;    // a checkpoint directory
  std::unique_ptr<TensorSource> hf;  // or a Hugging Face file / directory
  std::unique_ptr<WholeTensors> whole;
  std::unique_ptr<ModelLayout> model;
  const TensorReader& reader() const;
};

// `path`: a checkpoint directory, a --save directory (its newest complete
// checkpoint), a Hugging Face file, index or directory. Old formats are
// refused saying how to regenerate them. verify: hash every file first.
Input open_input(const std::string& path, const ModelFamilies& f, int64_t heads_hint = 0, bool verify = true);

struct ShardOptions {
  // {tp, pp, dp, heads[, stages]} (a constructor, so shorter forms leave the rest default without a
  // missing-initializer warning).
  ShardOptions(int tp_ = 1, int pp_ = 1, int dp_ = 1, int64_t heads_ = 0, std::vector<int> stages_ = {})
      : tp(tp_), pp(pp_), dp(dp_), heads(heads_), stages(std::move(stages_)) {}
  int tp, pp, dp;           // dp 0 (reshard): the source's own
  int64_t heads;            // Hugging Face sources without config.json or metadata: the head count
  std::vector<int> stages;  // layers per pp stage; empty: parallel/pipeline/partition.h's rule
  bool allow_nonfinite = false;
};

// The weights of `src` as a checkpoint in the layout `o` at `out_dir`
// (must not exist or be empty). Returns the bytes written.
uint64_t shard(const std::string& src, const std::string& out_dir, const ShardOptions& o, const ModelFamilies& f);

// `src` in the layout `o`, keeping what it holds: a training checkpoint
// goes to OUT/step_NNNNNNNN (so `train_gpt --resume OUT` continues from
// it) with its moments, step, run id and trainer state; a weights-only
// checkpoint or a Hugging Face source to OUT itself. Returns the checkpoint
// directory written.
std::string reshard(const std::string& src, const std::string& out_dir, const ShardOptions& o, const ModelFamilies& f);

// The weights of `src` (any input) as one Hugging Face file (max_shard_bytes
// == 0) or a Hugging Face directory (consolidate in checkpoint.h); the
// source's dtype per tensor, byte for byte. Returns the file names.
std::vector<std::string> consolidate_path(const std::string& src, const std::string& out, uint64_t max_shard_bytes,
                                          bool with_optimizer, bool allow_nonfinite, const ModelFamilies& f);

// "500MB", "2GB" (powers of 1000), "512MiB", "2GiB" (powers of 1024), a plain
// byte count: save_pretrained's max_shard_size. Throws InvalidArgument.
uint64_t parse_shard_size(const std::string& text);

}  // namespace tessera::parallel::checkpoint
