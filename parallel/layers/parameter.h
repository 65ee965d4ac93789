// Parameter: one model weight as this rank holds it (its TP shard), with the
// gradient beside it.
//
// Values and gradients are views into the flat buffers of a ParamBuffer
// (parallel/optim/param_buffer.h), which allocates them on the rank's Device
// so DP buckets and ZeRO-1 shards are contiguous ranges. A Parameter is
// usable once a ParamBuffer has bound it; layers own their Parameters and
// the ParamBuffer must outlive their use.
//
// Sharding: dimension `split_dim` of `full_shape` holds `chunks` equal blocks
// (3 for a fused QKV weight: q | k | v), and each block is split over the TP
// ranks in contiguous pieces of ceil(block / tp) (the last piece padded with
// zeros when the block does not divide, as for a vocabulary of 50257).
// With tp_parts < tp_size each block is cut into tp_parts pieces only and
// tp_size / tp_parts consecutive TP ranks hold the same piece (grouped-query
// attention's K/V heads replicated when tp exceeds them, as NxD does): TP
// rank r holds piece r / (tp_size / tp_parts) as replica r % (tp_size /
// tp_parts). A Parameter is also the checkpoint layer's descriptor of a
// tensor (parallel/checkpoint/): name, full shape, this rank's pieces, replica.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace tessera::parallel::layers {

enum class Init { Zeros, Ones, Normal };

// Parameter::layer of tensors outside the transformer layers: the first
// pipeline stage holds the embeddings, the last the final norm and LM head.
constexpr int kEmbeddingLayer = -1;
constexpr int kHeadLayer = -2;

struct Parameter {
  std::string name;  // Hugging Face name, e.g. "transformer.h.0.attn.c_attn.weight"
  Shape full_shape;
  Shape shape;         // this rank's shard
  int split_dim = -1;  // -1: replicated over TP
  int chunks = 1;
  int tp_size = 1, tp_rank = 0;
  int tp_parts = 1;  // pieces of each block (tp_size unless replicated pieces; 1 when not split)
  // The transformer layer holding it (its pipeline stage follows from the
  // partition), or kEmbeddingLayer / kHeadLayer.
  int layer = kEmbeddingLayer;
  bool decay = true;        // AdamW weight decay (not for biases, LayerNorms)
  bool sp_partial = false;  // under sequence parallelism each TP rank holds a partial gradient
  Init init = Init::Zeros;
  float init_std = 0.02f;

  float* value = nullptr;  // bound by ParamBuffer
  float* grad = nullptr;
  int64_t offset = 0;  // in the ParamBuffer's flat arrays
  int index = -1;

  int64_t numel() const { return shape_numel(shape); }
  bool tp_sharded() const { return split_dim >= 0 && tp_size > 1; }
  // The piece of each block this rank holds, and which copy of it (0: the
  // one that is saved and counted once; replicated tensors: tp_rank).
  int tp_part() const { return split_dim < 0 ? 0 : tp_rank / (tp_size / tp_parts); }
  int tp_replica() const { return split_dim < 0 ? tp_rank : tp_rank % (tp_size / tp_parts); }
  // Rows of split_dim per block on this rank (including padding).
  int64_t local_block() const;
  // Size of one block of split_dim in the full tensor.
  int64_t full_block() const;
};

// Makes a parameter; `split_dim`/`chunks` describe its TP sharding and
// `tp_parts` (0: tp_size; else a divisor of tp_size) the pieces of each block.
Parameter make_parameter(std::string name, Shape full_shape, int split_dim, int chunks, int tp_size, int tp_rank,
                         Init init, float init_std, bool decay, int tp_parts = 0);

// Calls fn(local_begin, full_begin, count) for runs of the shard that are
// contiguous in both the shard and the full tensor (one per outer index and
// block; the whole tensor when replicated), in local order; full_begin is -1
// for a run of padding. The one statement of the layout: the functions below
// are built on it.
void for_each_shard_run(const Parameter& p, const std::function<void(int64_t, int64_t, int64_t)>& fn);

// Calls fn(local_flat_index, full_flat_index) for every element of the
// shard; full_flat_index is -1 for padding.
void for_each_shard_element(const Parameter& p, const std::function<void(int64_t, int64_t)>& fn);

// A tensor's key in counter-based generators (FNV-1a of its name): the same
// on every rank and layout.
uint64_t hash_name(const std::string& name);

// Initialises the shard from a counter-based generator keyed by (seed, name,
// full index), so any layout gets exactly the serial model's values.
void init_parameter(Parameter& p, uint64_t seed);

// Copies the shard out of / into a full (host) fp32 array of full_shape.
void load_shard(Parameter& p, const float* full);
void store_shard(const Parameter& p, float* full);

}  // namespace tessera::parallel::layers
