// Trainer: the GPT training loop of train_gpt, usable from tests.
//
// One Trainer per rank. It owns the Device-resident model and the
// DistributedOptimizer for a ParallelState built by the caller (serial or
// from the world communicator), reads batches from the byte-level corpus
// (parallel/data/byte_dataset.h: a batch depends on the step and the global
// batch size only, never on the layout), and runs synchronous steps: each DP
// rank takes its global_batch / dp rows in micro-batches, the last
// micro-batch's backward launches the DP bucket reductions, then the
// optimizer clips and updates. With pp > 1 each rank holds its stage of the
// model (gpt_model.h) and runs the micro-batches under opts.schedule
// (parallel/pipeline/executor.h); the tied embedding's two copies sum their
// gradients over ps.embed, the loss comes from the last stage. Every rank of
// the job must make the same calls in the same order (they are collective).
// Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/checkpoint/checkpoint.h"
#include "parallel/data/byte_dataset.h"
#include "parallel/models/causal_lm.h"
#include "parallel/optim/optimizer.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/trace.h"

namespace tessera::parallel::models::gpt {

struct TrainOptions {
  // The model (family gpt or llama); model.max_seq is the context. Sizes
  // left 0 are filled by normalize() (complete_model_config).
  ModelConfig model = default_train_model();
  int64_t seq = 256;  // training sequence length (<= model.seq)
  int tp = 1, dp = 1;
  // Pipeline parallelism: pp stages running `schedule` over the step's
  // micro-batches (global_batch / dp / micro_batch of them per DP rank);
  // `stages` (layers per stage) overrides the partition rule.
  int pp = 1;
  parallel::pipeline::Schedule schedule = parallel::pipeline::Schedule::k1F1B;
  int virtual_stages = 1;   // model chunks per rank (interleaved schedule)
  std::vector<int> stages;  // pp x virtual_stages entries
  bool sequence_parallel = false;
  int64_t micro_batch = 8;
  int64_t global_batch = 0;  // 0: micro_batch * dp
  int64_t steps = 10;
  parallel::optim::AdamWConfig adamw;  // lr schedule filled from the fields below by normalize()
  double lr = 6e-4, min_lr = -1;       // min_lr < 0: lr / 10
  int64_t warmup = -1;                 // < 0: min(steps / 10, 100)
  uint64_t seed = 1234;
  // Mixed precision (docs/training.md, "bf16"), as NxD and Megatron-LM's
  // --bf16: F32, or BF16 parameters, activations and gradients on the
  // emulated cores (matmuls with fp32 accumulation; norms, softmax, the loss
  // and the optimizer in fp32) with fp32 master weights and moments in the
  // optimizer (sharded under ZeRO-1). master_weights false: pure bf16.
  // fp32_grads: gradients accumulated and reduced over DP in fp32
  // (Megatron's --accumulate-allreduce-grads-in-fp32); else in bf16.
  // stochastic_rounding: the updated weights rounded stochastically
  // (optim::AdamWConfig), keyed by seed.
  DType precision = DType::F32;
  bool master_weights = true;
  bool fp32_grads = false;
  bool stochastic_rounding = false;
  std::vector<std::string> data;  // empty: the default corpus
  double val_fraction = 0.05;

  // Fills defaults and checks everything against tp/dp/pp; throws InvalidArgument.
  void normalize();
  int64_t tokens_per_step() const { return global_batch * seq; }
  // Micro-batches per DP rank and step.
  int64_t micro_batches() const { return global_batch / dp / micro_batch; }
};

struct StepRecord {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  double wall_s = 0, tokens_per_s = 0;
  // Mean over the DP ranks of the wall seconds blocked on the gradient
  // reductions after backward (exposed communication and waiting for peers).
  double grad_wait_s = 0;
  // Modeled seconds on the emulated cores (runtime/sim_clock.h): step =
  // compute + comm + idle (pipeline waits), of the slowest pipeline stage.
  double modeled_step_s = 0, modeled_compute_s = 0, modeled_comm_s = 0, modeled_idle_s = 0, mfu = 0;
  uint64_t peak_mem_bytes = 0;
};

class Trainer {
 public:
  // `dataset` may be shared between trainers (threads) and must outlive it.
  Trainer(TrainOptions opts, const parallel::layers::ParallelState& ps,
          std::shared_ptr<const parallel::data::ByteDataset> dataset);
  ~Trainer();

  const TrainOptions& options() const { return opts_; }
  // This rank's model (its first chunk with virtual stages).
  CausalLM& model() { return *model_; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  CausalLM& chunk(int c) { return *chunks_.at(static_cast<size_t>(c)); }
  // Every parameter of this rank, chunk by chunk (Hugging Face order within each).
  std::vector<parallel::layers::Parameter*> parameters();
  // The token embedding or its tied copy when this rank holds one, else nullptr.
  parallel::layers::Parameter* tied_wte();
  // The last pipeline stage's copy of the tied embedding (nullptr when
  // pp == 1): kept equal to the first stage's wte, loaded but never saved.
  parallel::layers::Parameter* tied_copy();
  // pp > 1: the executor, whose spans() are the last step's pipeline timeline; else nullptr.
  const parallel::pipeline::PipelineExecutor* pipeline() const { return pipe_.get(); }
  parallel::optim::DistributedOptimizer& optimizer() { return *opt_; }

  // Random GPT-2 initialisation from opts.seed (identical for every layout).
  void init_random();
  // Loads Hugging Face weights of the model's family (parallel/models/hf_io.h;
  // every tensor's shape must match the model).
  void load_hf(const std::string& path);
  // Writes the full model for transformers (hf_io.h write_hf_model: one
  // .safetensors file, or a directory with config.json, sharded above
  // max_shard_bytes when > 0). Collective over TP and PP: each stage's TP
  // shards are gathered, the stages' tensors sent to stage 0; only global
  // rank 0 (dp 0, tp 0, stage 0) writes, the same files as a pp = 1 run
  // (the last stage's tied copy of the embedding is not written). `dtype`
  // (F32 or BF16) is how the weights are written and config.json's
  // torch_dtype: a bf16 run's parameters are exact in either (fp32 widens
  // them), an fp32 run's are rounded to nearest even for BF16.
  void export_hf(const std::string& path, uint64_t max_shard_bytes = 0, DType dtype = DType::F32);

  // Checkpoints (parallel/checkpoint/checkpoint.h, trainer_state.cc),
  // collective over every rank. save_checkpoint writes the state after
  // steps_done() into root/step_NNNNNNNN (keep > 0: then only the newest
  // `keep` complete checkpoints remain). load_checkpoint reads one saved
  // under any layout (parameters, AdamW moments, step, run id), after every
  // file's size and SHA-256 and every tensor's shape are checked; or, from a
  // `tessera ckpt shard` directory, the parameters only (step 0, fresh
  // optimizer). Throws FormatError / InvalidArgument before changing anything.
  // `ops`: the file system calls of the save (tests inject faults); nullptr: posix.
  parallel::checkpoint::SaveResult save_checkpoint(const std::string& root, int keep = 0, FileOps* ops = nullptr);
  void load_checkpoint(const std::string& dir);
  const std::string& run_id() const { return run_id_; }

  // One optimizer step (steps count from 1).
  StepRecord step();
  // pp > 1: the last step() as timeline spans of this rank
  // (parallel/pipeline/trace.h): zero_grad and the pipeline's ops, with
  // their TP collectives, and waits (phase 0), then the tied embedding's
  // sum, each DP bucket's reduction, the gradient norm, the AdamW update,
  // each ZeRO-1 all-gather and the loss sum (phase 1). On the wall clock the
  // DP collectives are instants at their issue and one span for the wait on
  // them. Empty before the first step or with pp == 1.
  std::vector<parallel::pipeline::TraceSpan> step_trace(parallel::pipeline::TraceClock clock) const;
  int64_t steps_done() const { return step_; }

  // Mean next-token loss over `windows` [count, seq + 1] token windows
  // (collective: DP ranks split the windows).
  double eval_windows(const std::vector<int32_t>& windows, int64_t count, int64_t seq);
  // Mean loss over `batches` global batches of the held-out split.
  double validation_loss(int64_t batches);

 private:
  double forward_rows(const int32_t* rows, int64_t nrows, int64_t seq, bool train, float grad_scale);
  class Stage;
  // pp > 1: one step's micro-batches through the pipeline; returns this
  // stage's loss sum (0 except on the last stage).
  double pipeline_step(float scale);
  // pp > 1: sum over `count` (<= micro_batch x micro-batches) rows of the
  // token losses of forward-only micro-batches filled by `fill(i, rows)`.
  double pipeline_eval(int64_t micro, const std::function<int64_t(int64_t, int32_t*)>& fill);
  // pp > 1: the tied embedding's two copies sum their gradients.
  void reduce_tied_embedding();

  TrainOptions opts_;
  const parallel::layers::ParallelState& ps_;
  std::shared_ptr<const parallel::data::ByteDataset> data_;
  std::vector<std::unique_ptr<CausalLM>> chunks_;
  CausalLM* model_ = nullptr;  // chunks_[0]
  std::unique_ptr<parallel::optim::DistributedOptimizer> opt_;
  std::unique_ptr<parallel::pipeline::PipelineExecutor> pipe_;
  int64_t step_ = 0;
  std::string run_id_;  // set by the first save or by a load
  std::vector<int32_t> rows_, inputs_, targets_;
  std::vector<float> stage_figures_;  // each stage's modeled step, compute, comm, idle
  // The last step's figures for step_trace(): modeled seconds and wall times (seconds since the epoch).
  struct StepMarks {
    double zero_grad_s = 0, embed_s = 0, loss_s = 0;
    double wall_start = 0, wall_pipe = 0, wall_embed0 = 0, wall_embed1 = 0, wall_opt0 = 0, wall_opt1 = 0, wall_end = 0;
    parallel::optim::StepStats stats;
  };
  StepMarks marks_;
};

}  // namespace tessera::parallel::models::gpt
