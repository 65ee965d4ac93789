// train_gpt: trains a GPT-2 over emulated cores with tensor, pipeline and
// data parallelism. Runs alone, under `tessera run --nproc-per-node N --
// train_gpt` or `mpirun -np N train_gpt`; the world size must equal tp x pp x dp.
// docs/training.md describes the flags and the output.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "examples/gpt/bootstrap.h"
#include "examples/gpt/model_flags.h"
#include "examples/gpt/plan_flags.h"
#include "examples/gpt/resume_flags.h"
#include "examples/gpt/sgemm_bench.h"
#include "launcher/cli.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/ckpt_tool.h"
#include "parallel/checkpoint/safetensors.h"
#include "parallel/mesh.h"
#include "parallel/models/gpt/hf.h"
#include "parallel/models/gpt/trainer.h"
#include "parallel/models/hf_config.h"
#include "parallel/models/hf_io.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/trace.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "runtime/kernels.h"
#include "runtime/log.h"
#include "runtime/topology.h"
#include "runtime/world.h"

namespace {

using namespace tessera;
namespace models = tessera::parallel::models;
namespace cli = tessera::launcher::cli;

struct Flags {
  models::gpt::TrainOptions t;
  std::string device = "trn1-core";
  std::string log_json, eval_text, init, export_path;
  bool allow_nonfinite = false;
  int64_t eval_windows = 64;
  int64_t val_every = 0, val_batches = 4;
  double bucket_mb = 4;
  bool bench_sgemm = false;
  // Training checkpoints (docs/checkpoint.md): --save DIR --save-every K --keep N --resume DIR|latest.
  std::string save, resume, resume_dir;  // resume_dir: the checkpoint --resume resolved to ("" : start at step 0)
  int64_t save_every = 0, keep = 0;
  bool tie = false;
  std::string max_shard_size;  // --max-shard-size
  uint64_t max_shard_bytes = 0;
  std::string schedule = "1f1b", stages, trace;
  std::string plan;                   // --plan FILE
  std::string topology;               // --topology PRESET|FILE
  std::string model, family = "gpt";  // --model, --family
  std::string trace_clock = "emulated";
  std::string precision = "fp32";  // --precision
  bool no_master_weights = false;
  std::string export_dtype;  // --export-dtype (default: the run's precision)
  gpt::PlanRun plan_run;
};

// Pipeline timeline of the last step, every rank's spans gathered on rank 0
// (collective over the world): prints each stage's bubble, read back from
// the trace, against the schedule's (p-1)/(v m+p-1) and the planner's
// prediction for the stage (the plan's with --plan) and, with --trace, writes
// the Chrome/Perfetto trace-event file (parallel/pipeline/trace.h).
std::string human_time(double s);

// " bf16 (fp32 masters, bf16 grads)" etc.; empty for fp32.
std::string precision_str(const models::gpt::TrainOptions& o) {
  if (o.precision != DType::BF16) return "";
  std::string s = " bf16 (";
  s += o.master_weights ? "fp32 masters" : "pure bf16";
  s += o.fp32_grads ? ", fp32 grads" : ", bf16 grads";
  if (o.stochastic_rounding) s += ", stochastic rounding";
  return s + ")";
}

void report_pipeline(const Flags& f, const gpt::Job& job, models::gpt::Trainer& trainer) {
  if (trainer.pipeline() == nullptr) return;
  const models::gpt::TrainOptions& o = trainer.options();
  const auto clock = parallel::pipeline::parse_trace_clock(f.trace_clock);
  const parallel::Mesh mesh({.tp = o.tp, .dp = o.dp, .pp = o.pp});
  std::vector<std::string> names;
  for (int r = 0; r < job.world.size; ++r) {
    const parallel::MeshCoord c = mesh.coord(r);
    names.push_back("rank " + std::to_string(r) + " (stage " + std::to_string(c.pp) + ", tp " + std::to_string(c.tp) +
                    ", dp " + std::to_string(c.dp) + ")");
  }
  nlohmann::json other{{"schedule", parallel::pipeline::schedule_name(o.schedule)},
                       {"pp", o.pp},
                       {"tp", o.tp},
                       {"dp", o.dp},
                       {"virtual_stages", o.virtual_stages},
                       {"micro_batches", o.micro_batches()},
                       {"step", trainer.steps_done()}};
  const std::string doc = parallel::pipeline::gather_trace(job.comm.get(), job.world.rank, trainer.step_trace(clock),
                                                           clock, names, other.dump());
  if (job.world.rank != 0) return;
  const auto bubbles = parallel::pipeline::trace_bubbles(doc, "the gathered trace");
  const double formula =
      parallel::pipeline::bubble_fraction(o.pp, static_cast<int>(o.micro_batches()), o.virtual_stages);
  const nlohmann::json od = nlohmann::json::parse(doc).at("otherData");
  const std::vector<double> predicted =
      f.plan.empty() ? gpt::predicted_stage_bubbles(o, f.device) : f.plan_run.stage_bubble;
  for (int s = 0; s < o.pp; ++s) {
    const int r = mesh.rank({.tp = 0, .dp = 0, .pp = s});
    double frac = 0;
    for (const auto& b : bubbles)
      if (b.rank == r) frac = b.fraction();
    // On the clock the planner predicts: the plan's value for the stage, or
    // without a plan the cost model's for this run's layout.
    std::string plan_text;
    if (clock == parallel::pipeline::TraceClock::kEmulated && static_cast<int>(predicted.size()) == o.pp) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "; %s %.1f%%", f.plan.empty() ? "predicted" : "planned",
                    100 * predicted[static_cast<size_t>(s)]);
      plan_text = buf;
    }
    std::printf("bubble stage %d: %.1f%% of the last step's pipeline (%s clock; %s: %.1f%%%s)\n", s, 100 * frac,
                parallel::pipeline::trace_clock_name(clock), parallel::pipeline::schedule_name(o.schedule),
                100 * formula, plan_text.c_str());
  }
  if (clock == parallel::pipeline::TraceClock::kEmulated)
    std::printf("timeline: pipeline %s, step %s on the emulated clock\n",
                human_time(od.at("pipeline_us").get<double>() * 1e-6).c_str(),
                human_time(od.at("step_us").get<double>() * 1e-6).c_str());
  if (!f.trace.empty()) {
    write_file_atomic(f.trace, doc);
    std::printf("trace %s\n", f.trace.c_str());
  }
  std::fflush(stdout);
}

std::string human_bytes(double b) {
  char buf[64];
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  return buf;
}

std::string human_time(double s) {
  char buf[64];
  if (s >= 1)
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  else if (s >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  return buf;
}

// The model comes from --init's config.json (or, for a GPT-2 file without
// one, its shapes and metadata) when given; explicit flags must agree.
void apply_init_config(Flags& f, const CLI::App& app) {
  auto src = parallel::checkpoint::open_safetensors(f.init);
  // --heads is a hint only for a GPT-2 file that records no head count; otherwise it must agree.
  const bool file_heads =
      models::gpt::gpt2_file_records_heads(*src) || parallel::models::hf_config_path(f.init).has_value();
  const int64_t heads_hint = app.count("--heads") && !file_heads ? f.t.model.heads : 0;
  const parallel::ModelConfig c = parallel::models::hf_model_config(f.init, *src, heads_hint);
  parallel::models::check_hf_tensors(*src, c);
  if (!f.allow_nonfinite) parallel::checkpoint::check_finite(*src);
  gpt::agree_model_flags(f.t.model, c, f.init, [&](const char* flag) { return app.count(flag) > 0; });
  if (!f.model.empty()) {
    parallel::ModelConfig a = f.t.model, b = c;
    a.name = b.name = "";
    TESSERA_ARG_CHECK(a == b, "--model ", f.model, " and --init ", f.init, " describe different models");
  }
  f.t.model = c;
  if (!app.count("--seq")) f.t.seq = std::min<int64_t>(f.t.seq, c.max_seq);
}

// --export FILE.safetensors is one file; any other path a model directory,
// which must be new or empty.
void check_export_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (parallel::models::hf_export_is_file(path)) {
    cli::check_output_file("--export", path);
    return;
  }
  if (fs::exists(path, ec)) {
    TESSERA_ARG_CHECK(fs::is_directory(path, ec) && fs::is_empty(path, ec), "--export: '", path,
                      "' exists and is not an empty directory (a path ending in .safetensors writes one file; any "
                      "other path a new Hugging Face model directory)");
    return;
  }
  const fs::path parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  TESSERA_ARG_CHECK(fs::is_directory(parent, ec), "--export: directory '", parent.string(), "' does not exist");
}

// --save/--resume flags (examples/gpt/resume_flags.h).
void apply_resume_config(Flags& f, const CLI::App& app) {
  f.resume_dir = gpt::apply_resume_flags(f.t, f.resume, f.save, f.init, f.save_every, f.keep,
                                         [&](const char* flag) { return app.count(flag) > 0; });
}

int train(Flags& f, const gpt::Job& job, const std::shared_ptr<parallel::data::ByteDataset>& dataset) {
  const bool lead = job.world.rank == 0;
  if (!f.plan.empty()) gpt::check_plan_world(f.plan_run, job.world.size);
  const int need = f.t.tp * f.t.dp * f.t.pp;
  TESSERA_ARG_CHECK(job.world.size == need, "this job has ", job.world.size, " process(es) but --tp ", f.t.tp,
                    " x --pp ", f.t.pp, " x --dp ", f.t.dp, " = ", need, " are needed");
  Device& dev = *job.device;
  parallel::layers::ParallelState ps =
      job.comm ? parallel::layers::make_parallel_state(job.comm, f.t.tp, f.t.dp, &dev, f.t.sequence_parallel, f.t.pp,
                                                       models::kv_replicas(f.t.model, f.t.tp))
               : parallel::layers::serial_state(&dev);
  ps.sequence_parallel = f.t.sequence_parallel;
  models::gpt::Trainer trainer(f.t, ps, dataset);
  const models::gpt::TrainOptions& o = trainer.options();
  if (!f.resume_dir.empty()) {
    trainer.load_checkpoint(f.resume_dir);
    if (lead)
      std::printf("train_gpt: resumed from step %lld of %s\n", (long long)trainer.steps_done(), f.resume_dir.c_str());
  } else if (f.init.empty()) {
    trainer.init_random();
    if (lead && !f.resume.empty())
      std::printf("train_gpt: --resume %s: no complete checkpoint in %s yet, starting at step 0\n", f.resume.c_str(),
                  f.save.c_str());
  } else {
    trainer.load_hf(f.init);
  }

  double sgemm_before = 0;
  if (f.bench_sgemm) sgemm_before = gpt::measure_sgemm_flops(o.model, o.micro_batch * o.seq, 2.0);

  std::unique_ptr<OutputStream> json;  // every write checked (runtime/files.h)
  if (lead && !f.log_json.empty()) json = std::make_unique<OutputStream>(f.log_json);
  if (lead) {
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    const std::string gqa = o.model.family != "llama" ? std::string()
                                                      : " kv_heads=" + std::to_string(o.model.kv_heads) +
                                                            " ffn=" + std::to_string(o.model.ffn_hidden) +
                                                            (o.model.tied_embeddings() ? " tied" : " untied");
    std::printf(
        "train_gpt: %d rank(s) tp=%d pp=%d dp=%d%s%s%s | %s vocab=%lld ctx=%lld hidden=%lld layers=%lld heads=%lld%s "
        "(%.2fM params) | seq=%lld micro-batch=%lld global-batch=%lld steps=%lld lr=%g | device %s | "
        "OPENBLAS_CORETYPE=%s\n",
        job.world.size, o.tp, o.pp, o.dp, o.sequence_parallel ? " sp" : "", o.adamw.zero1 ? " zero1" : "",
        precision_str(o).c_str(), o.model.family == "llama" ? "Llama" : "GPT-2", (long long)o.model.vocab,
        (long long)o.model.max_seq, (long long)o.model.hidden, (long long)o.model.layers, (long long)o.model.heads,
        gqa.c_str(), o.model.total_params() / 1e6, (long long)o.seq, (long long)o.micro_batch,
        (long long)o.global_batch, (long long)o.steps, o.lr, f.device.c_str(), coretype ? coretype : "(unset)");
    if (o.pp > 1)
      std::printf(
          "pipeline: %d stages x %d virtual, [%s] layers per virtual stage, schedule %s, %lld micro-batches per step "
          "per DP rank, bubble (p-1)/(v m+p-1) = %.1f%%\n",
          o.pp, o.virtual_stages, parallel::pipeline::stages_str(o.stages).c_str(),
          parallel::pipeline::schedule_name(o.schedule), (long long)o.micro_batches(),
          100 * parallel::pipeline::bubble_fraction(o.pp, static_cast<int>(o.micro_batches()), o.virtual_stages));
    std::fflush(stdout);
  }
  std::vector<double> step_times, sgemm_between, modeled_steps;
  for (int64_t s = trainer.steps_done(); s < o.steps; ++s) {
    models::gpt::StepRecord r = trainer.step();
    step_times.push_back(r.wall_s);
    modeled_steps.push_back(r.modeled_step_s);
    // Loss and gradient norm are reduced over every rank, so all ranks stop here together.
    if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
      if (lead)
        std::fprintf(stderr,
                     "train_gpt: step %lld: non-finite %s (loss %g, grad_norm %g); stopping (lower --lr, or check "
                     "the --init weights)\n",
                     (long long)r.step, std::isfinite(r.loss) ? "gradient norm" : "loss", r.loss, r.grad_norm);
      return 1;
    }
    // Interleaved with the steps, so a machine shared with other work slows
    // both measurements alike.
    if (f.bench_sgemm && lead) sgemm_between.push_back(gpt::measure_sgemm_flops(o.model, o.micro_batch * o.seq, 1.0));
    if (lead) {
      std::printf(
          "step %lld/%lld loss %.4f grad_norm %.4f lr %.3g tokens/s %.0f modeled_step %s mfu %.1f%% peak_mem %s\n",
          (long long)r.step, (long long)o.steps, r.loss, r.grad_norm, r.lr, r.tokens_per_s,
          human_time(r.modeled_step_s).c_str(), 100 * r.mfu, human_bytes(double(r.peak_mem_bytes)).c_str());
      std::fflush(stdout);
      if (json) {
        nlohmann::json j{{"step", r.step},
                         {"loss", r.loss},
                         {"grad_norm", r.grad_norm},
                         {"lr", r.lr},
                         {"tokens_per_s", r.tokens_per_s},
                         {"wall_s", r.wall_s},
                         {"grad_wait_s", r.grad_wait_s},
                         {"modeled_step_s", r.modeled_step_s},
                         {"modeled_compute_s", r.modeled_compute_s},
                         {"modeled_comm_s", r.modeled_comm_s},
                         {"modeled_idle_s", r.modeled_idle_s},
                         {"mfu", r.mfu},
                         {"peak_mem_bytes", r.peak_mem_bytes}};
        json->write(j.dump() + "\n");
      }
    }
    if (f.val_every > 0 && (r.step % f.val_every == 0 || r.step == o.steps)) {
      double v = trainer.validation_loss(f.val_batches);
      if (lead) {
        std::printf("val_loss %.4f step %lld\n", v, (long long)r.step);
        std::fflush(stdout);
      }
    }
    // Test hook for recovery: TESSERA_TEST_KILL_AT_STEP=S (TESSERA_TEST_KILL_RANK, default 0) SIGKILLs
    // that rank after step S in the first round of `tessera run` only (TESSERA_RESTART_COUNT unset or 0).
    if (const char* k = std::getenv("TESSERA_TEST_KILL_AT_STEP"); k && std::atoll(k) == r.step) {
      const char* kr = std::getenv("TESSERA_TEST_KILL_RANK");
      const char* rc = std::getenv("TESSERA_RESTART_COUNT");
      if ((kr ? std::atoi(kr) : 0) == job.world.rank && (!rc || std::atoi(rc) == 0)) ::raise(SIGKILL);
    }
    if (!f.save.empty() && ((f.save_every > 0 && r.step % f.save_every == 0) || r.step == o.steps)) {
      Stopwatch sw;
      const std::clock_t cpu0 = std::clock();
      parallel::checkpoint::SaveResult saved = trainer.save_checkpoint(f.save, static_cast<int>(f.keep));
      if (lead) {
        std::printf("saved %s (%s in %s, cpu %.3f s)\n", saved.dir.c_str(), human_bytes(double(saved.bytes)).c_str(),
                    human_time(sw.seconds()).c_str(), double(std::clock() - cpu0) / CLOCKS_PER_SEC);
        std::fflush(stdout);
      }
    }
  }
  if (json) json->close();  // a failed fsync or close is an error too
  if (o.steps > 0) report_pipeline(f, job, trainer);
  if (lead && !f.plan.empty() && !modeled_steps.empty()) {
    // Step 1 first-touches every buffer; later steps are the steady state.
    std::vector<double> v(modeled_steps.begin() + (modeled_steps.size() > 1 ? 1 : 0), modeled_steps.end());
    std::sort(v.begin(), v.end());
    const double emulated = v[v.size() / 2], predicted = f.plan_run.predicted_step_s;
    std::printf("step time: predicted %s (%s), emulated %s (median modeled step%s, %+.1f%%)\n",
                human_time(predicted).c_str(), f.plan.c_str(), human_time(emulated).c_str(),
                modeled_steps.size() > 1 ? " after step 1" : "",
                // Rounded to the printed digit, + 0.0 so that a rounded -0 prints as +0.0.
                predicted > 0 ? std::round(1000 * (emulated - predicted) / predicted) / 10 + 0.0 : 0.0);
    std::fflush(stdout);
  }
  if (!f.eval_text.empty()) {
    std::vector<int32_t> windows;
    int64_t n = parallel::data::eval_windows(f.eval_text, o.seq, f.eval_windows, &windows);
    double e = trainer.eval_windows(windows, n, o.seq);
    if (lead) {
      std::printf("eval_loss %.6f\n", e);
      std::fflush(stdout);
    }
  }
  if (f.bench_sgemm && lead && step_times.size() >= 2) {
    double sgemm_after = gpt::measure_sgemm_flops(o.model, o.micro_batch * o.seq, 2.0);
    const double flops_per_step =
        models::train_flops_per_token(o.model) * static_cast<double>(o.tokens_per_step()) / (o.tp * o.dp * o.pp);
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    };
    // Step 1 warms up (first touch of every buffer); ratios per step against
    // the sgemm measured right after it.
    std::vector<double> ratios;
    for (size_t i = 1; i < step_times.size(); ++i) ratios.push_back(flops_per_step / step_times[i] / sgemm_between[i]);
    const double med_step = median(std::vector<double>(step_times.begin() + 1, step_times.end()));
    std::printf(
        "bench: sgemm %.2f GFLOP/s before, %.2f after, median %.2f between steps (model GEMM shapes, 1 thread); "
        "training %.2f GFLOP/s per rank (median step %.3f s, %.0f tokens/s, %.1f MFLOP/token); "
        "training / sgemm: %.1f%% median over steps (min %.1f%%, max %.1f%%)\n",
        sgemm_before / 1e9, sgemm_after / 1e9, median(sgemm_between) / 1e9, flops_per_step / med_step / 1e9, med_step,
        o.tokens_per_step() / med_step, models::train_flops_per_token(o.model) / 1e6, 100 * median(ratios),
        100 * *std::min_element(ratios.begin(), ratios.end()), 100 * *std::max_element(ratios.begin(), ratios.end()));
  }
  if (!f.export_path.empty()) {
    trainer.export_hf(f.export_path, f.max_shard_bytes, f.export_dtype == "bf16" ? DType::BF16 : DType::F32);
    if (lead) std::printf("exported %s\n", f.export_path.c_str());
  }
  return 0;
}

int run(int argc, char** argv) {
  kern::default_blas_threads();
  Flags f;
  CLI::App app{"Train a GPT-2 over emulated cores with tensor, pipeline and data parallelism", "train_gpt"};
  app.footer(
      "Temporary files: checkpoint files and --export go through .NAME.tmp.<pid>.XXXXXX next to the file, renamed "
      "into place; a killed run's are removed by the next write of the same file.");
  app.add_option("--tp", f.t.tp, "tensor-parallel degree")->check(cli::positive(f.t.tp));
  app.add_option("--dp", f.t.dp, "data-parallel degree")->check(cli::positive(f.t.dp));
  app.add_option("--pp", f.t.pp, "pipeline-parallel degree (stages)")->check(cli::positive(f.t.pp));
  app.add_option("--schedule", f.schedule, "pipeline schedule: gpipe, 1f1b or interleaved")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  app.add_option("--virtual-stages", f.t.virtual_stages, "model chunks per pipeline rank (interleaved schedule)")
      ->check(cli::positive(f.t.virtual_stages));
  app.add_option(
      "--trace", f.trace,
      "pipeline runs: write the last step's timeline, every rank (Chrome/Perfetto trace-event JSON), to FILE");
  app.add_option("--trace-clock", f.trace_clock, "--trace's clock: emulated (the modeled device time) or wall")
      ->check(CLI::IsMember({"emulated", "wall"}));
  app.add_option("--plan", f.plan,
                 "run a plan written by `tessera plan --json` (layout, micro-batch, schedule, partition, model sizes)")
      ->check(CLI::ExistingFile);
  app.add_option("--stages", f.stages, "layers per pipeline stage, e.g. 3,3,2,2 (default: even, leftover to later)");
  app.add_flag("--sequence-parallel", f.t.sequence_parallel, "shard LayerNorm/residual activations over TP");
  app.add_option("--model", f.model,
                 "the model: a preset (tessera plan's), a model JSON, or a Hugging Face config.json or directory");
  app.add_option("--family", f.family, "model family: gpt (GPT-2) or llama (RMSNorm, RoPE, SwiGLU, GQA)")
      ->check(CLI::IsMember({"gpt", "llama"}));
  app.add_option("--kv-heads", f.t.model.kv_heads, "llama: key/value heads (grouped-query attention; default heads)")
      ->check(cli::positive(f.t.model.kv_heads));
  app.add_option("--ffn-hidden", f.t.model.ffn_hidden, "MLP width (default 4 x hidden; llama 8/3 x hidden, to 64)")
      ->check(cli::positive(f.t.model.ffn_hidden));
  app.add_option("--rope-theta", f.t.model.rope_theta, "llama: rotary base (default 10000)")
      ->check(cli::number_range(1.0 + 1e-9, 1e12));
  app.add_flag("--tie-embeddings", f.tie, "llama: tie the LM head to the token embedding");
  app.add_option("--layers", f.t.model.layers, "transformer blocks")->check(cli::positive(f.t.model.layers));
  app.add_option("--hidden", f.t.model.hidden, "model width")->check(cli::positive(f.t.model.hidden));
  app.add_option("--heads", f.t.model.heads, "attention heads")->check(cli::positive(f.t.model.heads));
  app.add_option("--seq", f.t.seq, "sequence length (also the context, without --init)")->check(cli::positive(f.t.seq));
  app.add_option("--vocab", f.t.model.vocab, "vocabulary (>= 256: byte tokens)")->check(cli::positive(f.t.model.vocab));
  app.add_option("--micro-batch", f.t.micro_batch, "sequences per micro-batch per DP rank")
      ->check(cli::positive(f.t.micro_batch));
  app.add_option("--global-batch", f.t.global_batch, "sequences per step (default micro-batch x dp)")
      ->check(cli::positive(f.t.global_batch));
  app.add_option("--steps", f.t.steps, "optimizer steps")->check(cli::non_negative(f.t.steps));
  app.add_option("--lr", f.t.lr, "peak learning rate")->check(cli::positive(f.t.lr));
  app.add_option("--min-lr", f.t.min_lr, "final learning rate of the cosine decay (default lr/10)")
      ->check(cli::non_negative(f.t.min_lr));
  app.add_option("--warmup", f.t.warmup, "warm-up steps (default min(steps/10, 100))")
      ->check(cli::non_negative(f.t.warmup));
  app.add_option("--weight-decay", f.t.adamw.weight_decay, "AdamW decoupled weight decay")
      ->check(cli::non_negative(f.t.adamw.weight_decay));
  app.add_option("--clip-grad", f.t.adamw.clip_norm, "clip the global gradient norm to this (0: off)")
      ->check(cli::non_negative(f.t.adamw.clip_norm));
  app.add_option("--seed", f.t.seed, "initialisation and data seed")->check(cli::any_int(f.t.seed));
  app.add_flag("--zero1", f.t.adamw.zero1, "shard AdamW states over DP (ZeRO-1)");
  app.add_option("--precision", f.precision,
                 "fp32, or bf16: bf16 parameters, activations and gradients with fp32 master weights and moments")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_flag("--no-master-weights", f.no_master_weights, "bf16: no fp32 master weights (pure bf16)");
  app.add_flag("--accumulate-allreduce-grads-in-fp32", f.t.fp32_grads,
               "bf16: accumulate gradients and reduce them over DP in fp32 (default bf16)");
  app.add_flag("--stochastic-rounding", f.t.stochastic_rounding,
               "bf16: round updated weights stochastically (the same draws in every layout)");
  app.add_option("--bucket-mb", f.bucket_mb, "DP gradient bucket size in MiB")->check(cli::number_range(1e-6, 1 << 20));
  app.add_option("--device", f.device, "emulated core")->check(CLI::IsMember(DeviceSpec::preset_names()));
  app.add_option("--topology", f.topology,
                 "Place the ranks on this topology (a `tessera plan` preset or JSON file; its first world-size "
                 "cores, in the planner's placement) and charge each collective on the links its group spans "
                 "(default emulated:N: every group its own ring)");
  app.add_option("--log-json", f.log_json, "write one JSON object per step to FILE");
  app.add_option("--eval-text", f.eval_text, "print eval_loss over windows of FILE after training")
      ->check(CLI::ExistingFile);
  app.add_option("--eval-windows", f.eval_windows, "at most N eval windows")->check(cli::positive(f.eval_windows));
  app.add_option("--val-every", f.val_every, "print held-out val_loss every N steps (0: off)")
      ->check(cli::non_negative(f.val_every));
  app.add_option("--val-batches", f.val_batches, "global batches of the held-out split per val_loss")
      ->check(cli::positive(f.val_batches));
  app.add_option("--init", f.init, "start from a Hugging Face GPT-2 safetensors file")->check(CLI::ExistingPath);
  app.add_flag("--allow-nonfinite", f.allow_nonfinite, "load an --init file even when it holds NaN or Inf weights");
  app.add_option("--export", f.export_path,
                 "write the final weights for Hugging Face transformers: FILE.safetensors, or a directory "
                 "(config.json and model.safetensors, sharded above --max-shard-size)");
  app.add_option("--export-dtype", f.export_dtype,
                 "--export's weights and config.json torch_dtype: fp32 or bf16 (default: the run's --precision)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--max-shard-size", f.max_shard_size,
                 "--export DIR: the largest safetensors file, e.g. 500MB or 2GiB (default: one file)");
  app.add_option("--data", f.t.data, "training text files (default: /usr/share/common-licenses/*)")
      ->check(CLI::ExistingFile);
  app.add_option("--save", f.save,
                 "write training checkpoints into DIR/step_NNNNNNNN (every --save-every, and at the end)");
  app.add_option("--save-every", f.save_every, "save every K steps (0: only at the end)")
      ->check(cli::non_negative(f.save_every));
  app.add_option("--keep", f.keep, "keep only the newest N complete checkpoints (0: all)")
      ->check(cli::non_negative(f.keep));
  app.add_option("--resume", f.resume, "resume from a checkpoint DIR, a --save DIR's newest, or 'latest' (of --save)");
  app.add_flag("--bench-sgemm", f.bench_sgemm, "measure sgemm at the model's GEMM shapes and compare");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return cli::kUsageExit;
  }
  f.t.model.max_seq = static_cast<int>(f.t.seq);
  if (f.tie) f.t.model.tie_embeddings = true;
  f.t.adamw.bucket_elems = static_cast<int64_t>(f.bucket_mb * (1 << 20) / 4);
  f.t.precision = f.precision == "bf16" ? DType::BF16 : DType::F32;
  f.t.master_weights = !f.no_master_weights;
  // Bad flags and bad input files exit 2 before any process joins the job
  // (docs/errors.md): every rank checks what it reads, rank 0 what it writes.
  std::shared_ptr<parallel::data::ByteDataset> dataset;
  try {
    gpt::apply_model_flags(f.t, f.model, f.family, [&](const char* flag) { return app.count(flag) > 0; });
    if (!f.init.empty()) apply_init_config(f, app);
    if (!f.stages.empty()) f.t.stages = parallel::pipeline::parse_stages(f.stages);
    if (!f.plan.empty()) {
      f.plan_run = gpt::apply_plan(f.plan, f.t, f.schedule, f.device, !f.init.empty(),
                                   [&](const char* flag) { return app.count(flag) > 0; });
      gpt::check_plan_world(f.plan_run, discover_world().size);
    }
    f.t.schedule = parallel::pipeline::parse_schedule(f.schedule);
    TESSERA_ARG_CHECK(f.stages.empty() || app.count("--pp") || !f.plan.empty(),
                      "--stages needs --pp (the number of stages)");
    if (f.t.schedule == parallel::pipeline::Schedule::kInterleaved && !app.count("--virtual-stages") && f.plan.empty())
      f.t.virtual_stages = 2;  // Megatron's usual choice when only the schedule is named
    apply_resume_config(f, app);
    TESSERA_ARG_CHECK(f.max_shard_size.empty() || !f.export_path.empty(), "--max-shard-size needs --export DIR");
    TESSERA_ARG_CHECK(f.export_dtype.empty() || !f.export_path.empty(), "--export-dtype needs --export");
    if (f.export_dtype.empty()) f.export_dtype = f.t.precision == DType::BF16 ? "bf16" : "fp32";
    if (!f.max_shard_size.empty()) f.max_shard_bytes = parallel::checkpoint::parse_shard_size(f.max_shard_size);
    f.t.normalize();
    TESSERA_ARG_CHECK(f.trace.empty() || f.t.pp > 1, "--trace needs a pipeline (--pp > 1)");
    if (discover_world().rank == 0) {
      if (!f.export_path.empty()) check_export_path(f.export_path);
      if (!f.log_json.empty()) cli::check_output_file("--log-json", f.log_json);
      if (!f.trace.empty()) cli::check_output_file("--trace", f.trace);
    }
    dataset = std::make_shared<parallel::data::ByteDataset>(
        f.t.data.empty() ? parallel::data::ByteDataset::default_files() : f.t.data, f.t.val_fraction, f.t.seed);
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "train_gpt: %s\nRun with --help for more information.\n", e.what());
    return cli::kUsageExit;
  } catch (const FormatError& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return cli::kUsageExit;
  } catch (const Error& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 1;
  }
  gpt::RankPlacement placed;  // --topology: the ranks placed as `tessera plan` places them
  try {
    // A plan carries its topology: its ranks are placed there unless --topology says otherwise (a plan made
    // on a JSON topology names it only; then --topology FILE places them).
    if (f.topology.empty() && !f.plan_run.topology.empty()) {
      // "trn1.32xlarge (first 8 cores)": the preset, cut to this job's size below.
      const std::string name = f.plan_run.topology.substr(0, f.plan_run.topology.find(" (first "));
      bool preset = false;
      for (const std::string& n : Topology::preset_names())
        preset = preset || n == name || (n.back() == 'N' && name.rfind(n.substr(0, n.size() - 1), 0) == 0);
      if (preset)
        f.topology = name;
      else if (discover_world().rank == 0)
        std::fprintf(stderr,
                     "train_gpt: the plan's topology '%s' cannot be rebuilt from its name; give --topology to place "
                     "the ranks on it (now each group is charged as its own ring)\n",
                     f.plan_run.topology.c_str());
    }
    placed = gpt::place_ranks(f.topology, {}, parallel::Mesh({.tp = f.t.tp, .dp = f.t.dp, .pp = f.t.pp}),
                              discover_world().size);
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "train_gpt: --topology: %s\n", e.what());
    return cli::kUsageExit;
  } catch (const FormatError& e) {
    std::fprintf(stderr, "train_gpt: --topology: %s\n", e.what());
    return cli::kUsageExit;
  }
  return gpt::run_job(
      f.device,
      [&](const gpt::Job& job) {
        try {
          return train(f, job, dataset);
        } catch (const InvalidArgument& e) {
          std::fprintf(stderr, "train_gpt: %s\n", e.what());
          return cli::kUsageExit;
        }
      },
      placed.net, placed.nodes);
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_main("train_gpt", [&] { return run(argc, argv); });
}
