// Cost model: memory per rank and step time of one (tp, pp, dp, ...) choice
// for a transformer on a topology. docs/planner.md gives every formula with
// its source; in short:
//   - model states per parameter: bf16 mixed precision 2 (weights) + 2 (grads)
//     + 12 (fp32 master, Adam m and v), the 12 divided by dp with ZeRO-1;
//     fp32 training 4 + 4 + 8 (ZeRO paper, Rajbhandari et al. 2020);
//   - activations per layer after Korthikanti et al. 2022, times the
//     micro-batches (or interleaved chunks) the 1F1B schedule holds in flight;
//   - FLOPs after Narayanan et al. 2021, built from per-layer terms so that
//     full recompute gives exactly 96 B s l h^2 (1 + s/6h + V/16lh);
//   - step time built from the same per-kernel and per-collective costs the
//     emulated cores charge: every kernel of a micro-batch's forward and
//     backward (runtime/kernel_cost.h: launch + roofline at the sustained
//     rate), every collective as the communicator would run it
//     (collectives/coll_cost.h: the algorithm it picks and the seconds that
//     algorithm charges), the optimizer step, and the pipeline schedule
//     itself, simulated as the executor runs it (waits for neighbours and
//     link transfers). Nothing overlaps, as on the emulated cores, unless
//     TrainingConfig::overlap_grad_reduce (the DP reductions with the backward)
//     or, with the Megatron-LM runtime, overlap_tp_backward (the column-parallel
//     layers' TP collectives of the backward pass with their GEMMs).
// All functions are pure; a CostModel may be shared across threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/coll_cost.h"
#include "parallel/mesh.h"
#include "parallel/model_config.h"
#include "parallel/pipeline/schedule.h"
#include "runtime/netmodel.h"
#include "runtime/topology.h"

namespace tessera::parallel {

enum class Recompute { None, Selective, Full };
const char* recompute_name(Recompute r);
Recompute parse_recompute(const std::string& s);  // none|selective|full, else InvalidArgument

// Which software runs the step. Tessera: tessera's own kernels, pipeline
// and communicator, as the emulated cores charge them (fused causal
// attention, reductions widened to fp32 on the wire, whole activations
// between stages). MegatronLM: Megatron-LM as Narayanan et al. 2021 and
// Korthikanti et al. 2022 measured it: attention as two batched GEMMs over
// the whole s x s square with a fused scale-mask-softmax and dropout on the
// probabilities (the kernels whose outputs Korthikanti's 5as^2b counts),
// reductions in the 16-bit type (NCCL), the scatter-gather optimisation
// between stages (each TP rank sends 1/t of the activation, the receiver
// all-gathers it over NVLink; Narayanan et al. section 4.1), and with
// sequence parallelism the all-gather of each column-parallel input redone
// in the backward pass (Korthikanti section 4.2.2).
enum class StepRuntime { Tessera, MegatronLM };
const char* runtime_name(StepRuntime r);
StepRuntime parse_runtime(const std::string& s);  // tessera|megatron-lm, else InvalidArgument

// The workload and the knobs that are not searched.
struct TrainingConfig {
  int64_t global_batch = 0;  // sequences per step
  int seq = 0;               // tokens per sequence
  bool fp32 = false;         // fp32 training instead of bf16 mixed precision
  // Fraction of peak FLOP/s a core sustains on kernels; <= 0: the device's
  // own DeviceSpec::sustained_fraction (what the emulated cores charge), or
  // with the Megatron-LM runtime its megatron_sustained_fraction when set
  // (the GEMM library of the published runs).
  double efficiency = 0;
  double memory_fraction = 0.9;    // of HBM usable for the terms modeled (rest: workspace, fragmentation)
  int64_t bucket_elems = 1 << 20;  // DP gradient bucket (train_gpt --bucket-mb 4)
  StepRuntime runtime = StepRuntime::Tessera;
  // Each DP gradient bucket's reduction overlapped with the rest of the last
  // micro-batch's backward pass, as bucketed DP does (Megatron-LM's
  // --overlap-grad-reduce, PyTorch DDP, NxD): what the backward cannot hide
  // and the last bucket's reduction show. Off: the reductions follow the
  // backward pass, as the emulated cores charge them (and as Megatron-LM's
  // local DDP of 2021-22 ran them).
  bool overlap_grad_reduce = false;
  // Megatron-LM's column-parallel backward overlapped with its GEMMs: the
  // input gradient's TP all-reduce runs beside the weight-gradient GEMM
  // (ColumnParallelLinearWithAsyncAllreduce, on unless
  // --no-async-tensor-model-parallel-allreduce); with sequence parallelism the
  // input's all-gather beside the input-gradient GEMM and the reduce-scatter
  // beside the weight-gradient GEMM. Megatron-LM has it since late 2021; the
  // 2021 code Narayanan et al. measured reduced after both GEMMs. Only with
  // the Megatron-LM runtime (tessera's TP collectives block) and GPT
  // layers (a Llama layer is LlamaModel's): CostModel refuses it otherwise.
  // Off here; `tessera plan` turns it on where it applies unless
  // --overlap-tp-backward off.
  bool overlap_tp_backward = false;
  // Megatron-LM's --fp16-lm-cross-entropy: its cross entropy on the 16-bit
  // logits instead of on an fp32 copy (its default, and the published
  // runs'). Only with the Megatron-LM runtime in 16 bits.
  bool fp16_lm_cross_entropy = false;
};

// One point of the search space.
struct PlanChoice {
  int tp = 1, pp = 1, dp = 1;
  int micro_batch = 1;
  int virtual_stages = 1;
  // With pp > 1: gpipe or 1f1b (v == 1), interleaved (v > 1).
  pipeline::Schedule schedule = pipeline::Schedule::k1F1B;
  bool zero1 = false;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::None;
  std::vector<int> stage_layers;  // layers per pipeline stage (sums to the model's layers)
  bool balanced = false;          // stage_layers from the balanced partition rather than the even one
};

struct MemoryBreakdown {
  double params = 0, grads = 0, optimizer = 0, activations = 0, total = 0;  // bytes
};

// Seconds per step of the slowest stage: its kernels (compute, with the
// optimizer's), its TP collectives, its PP collectives (tied embedding,
// loss, norm), the time it waits for its pipeline neighbours (bubble, link
// transfers included) and its DP collectives.
struct TimeBreakdown {
  double compute = 0, tp_comm = 0, pp_comm = 0, bubble = 0, dp_comm = 0, total = 0;  // seconds
};

// One pipeline stage's share of the step's pipeline phase (zero_grad, then
// its forwards and backwards, until the slowest stage's last op ends), as a
// trace shows it (parallel/pipeline/trace.h, trace_bubbles): busy, its
// forward and backward ops (their TP collectives included); bubble, idle
// until a neighbour sent plus the drain after its own last op; p2p, the rest
// of the link transfers it waited for. fraction() is trace_bubbles' bubble
// fraction, (p - 1) / (v m + p - 1) when the stages are equal and the links free.
struct StageBubble {
  double busy = 0, bubble = 0, p2p = 0;  // seconds
  double fraction() const {
    const double total = busy + bubble + p2p;
    return total > 0 ? bubble / total : 0;
  }
};

struct PlanCost {
  MemoryBreakdown memory;  // of the stage that needs the most
  int memory_stage = 0;
  TimeBreakdown time;
  int time_stage = 0;  // the slowest stage, which paces the pipeline
  int num_micro_batches = 0;
  double flops_per_step = 0;               // hardware FLOPs (with recompute), Narayanan et al.
  double model_flops_per_step = 0;         // without recompute
  double achieved_flops_per_device = 0;    // flops_per_step / (step time * cores)
  double mfu = 0;                          // model FLOPs / (step time * cores * peak)
  std::vector<StageBubble> stage_bubbles;  // per pipeline stage (empty for pp = 1)
};

// ---- the formulas, exposed for tests and docs ------------------------------------

// The fraction of peak a GEMM of ideal shape sustains in this configuration:
// --efficiency when given, else with the Megatron-LM runtime the device's
// megatron_sustained_fraction when it names one, else its sustained_fraction.
double gemm_sustained_fraction(const DeviceSpec& device, const TrainingConfig& train);

// FLOPs of one training step for `batch` sequences of `seq` tokens.
double step_flops(const ModelConfig& m, double batch, int seq, Recompute r);
// Forward FLOPs of one layer for `batch` sequences (matmuls + attention scores).
double layer_forward_flops(const ModelConfig& m, double batch, int seq);
// Activation bytes one layer keeps for one micro-batch of b sequences, per TP rank
// (Korthikanti et al. 2022, 16-bit; doubled for fp32).
double layer_activation_bytes(const ModelConfig& m, int seq, int b, int tp, bool sequence_parallel, Recompute r,
                              bool fp32 = false);
// Bytes per parameter of weights, gradients and optimizer states.
struct StateBytes {
  double weights, grads, optimizer;
};
StateBytes state_bytes_per_param(bool fp32, bool zero1, int dp);
// Micro-batches (interleaved: model chunks) that stage `stage` holds in flight
// under Megatron's 1F1B schedules (GPipe: all of them).
int in_flight(int stage, int pp, int virtual_stages, int num_micro_batches,
              pipeline::Schedule schedule = pipeline::Schedule::k1F1B);
// Layers per stage: even (pipeline::stage_layers, the rule `tessera ckpt shard`
// uses too), or balanced so that the last stage's LM head counts
// as `head_layers` extra layers and any extra layer goes to later stages.
std::vector<int> partition_layers(int layers, int pp, bool balanced, double head_layers);

// What each group's communicator knows (collectives/coll_cost.h): TP, DP,
// the whole PP group, one link between neighbouring stages (the executor's
// send/recv communicators) and the tied embedding's first-and-last-stage group.
struct GroupNets {
  collectives::GroupCostModel tp, dp, pp, link, embed;
  // Llama with tp > kv_heads: the TP ranks that hold one K/V head (kv_replicas of them).
  collectives::GroupCostModel kv;
};
// TP ranks holding each K/V head: tp / kv_heads when tp exceeds them, else 1.
int kv_replicas_of(const ModelConfig& m, int tp);
// The groups of rank 0 as train_gpt models them without a topology: each
// communicator a ring of its own members (NetModel::default_ring), shared
// memory between the ranks (one host).
GroupNets emulated_group_nets(int tp, int pp, int dp, int kv_replicas = 1);
// The groups of rank 0 placed on a topology, as communicators built with
// CommOptions::net = the topology's model and world ranks = cores would see
// them; shared memory when the topology is one instance.
GroupNets placement_group_nets(const Topology& topo, const Placement& placement, int kv_replicas = 1);

// A pipeline of p stages running `schedule` over m micro-batches, simulated
// as PipelineExecutor runs it: an op starts when this stage is free and its
// input has arrived (sent when the producing op ended, plus the link
// transfer). fwd/bwd[s][c]: seconds of chunk c's forward/backward on stage s.
struct PipelineTimes {
  std::vector<double> end, wait;  // per stage: when its last op ends, and its waits' total
  // The waits split as the executor traces them: idle until the neighbour
  // sent (the bubble), then the rest of the link transfer (p2p); idle + link = wait.
  std::vector<double> idle, link;
};
PipelineTimes simulate_pipeline(pipeline::Schedule schedule, int p, int m, int v,
                                const std::vector<std::vector<double>>& fwd,
                                const std::vector<std::vector<double>>& bwd, double transfer_s);

class CostModel {
 public:
  CostModel(const ModelConfig& model, const DeviceSpec& device, const TrainingConfig& train);

  PlanCost evaluate(const PlanChoice& c, const GroupNets& nets) const;
  // Usable bytes per core (HBM times memory_fraction).
  double memory_capacity() const;
  // The LM head's forward cost in layer equivalents (for partition_layers).
  double head_layers() const;
  // The device as the cost model sees it (sustained_fraction = the efficiency).
  const DeviceSpec& device() const { return device_; }

  const ModelConfig& model() const { return model_; }
  const TrainingConfig& train() const { return train_; }

 private:
  ModelConfig model_;
  DeviceSpec device_;
  TrainingConfig train_;
};

}  // namespace tessera::parallel
