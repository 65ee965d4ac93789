// generate: text generation with a KV cache on emulated cores, the model
// tensor-parallel over the job's ranks. Runs alone, under `tessera run
// --nproc-per-node N -- generate` or `mpirun -np N generate`; the world size
// must equal --tp. docs/inference.md describes the flags and the output.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "examples/gpt/bootstrap.h"
#include "examples/gpt/model_flags.h"
#include "launcher/cli.h"
#include "parallel/inference_planner.h"
#include "parallel/layers/parallel_state.h"
#include "parallel/mesh.h"
#include "parallel/models/causal_lm.h"
#include "parallel/models/generation.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "runtime/kernels.h"
#include "runtime/library_text.h"
#include "runtime/topology.h"
#include "runtime/world.h"

namespace {

using namespace tessera;
namespace models = tessera::parallel::models;
namespace cli = tessera::launcher::cli;

struct Flags {
  std::string init, model, json, prompt_file, requests, device, topology, precision = "fp32";
  std::vector<std::string> prompts, prompt_tokens;
  int tp = 1, max_batch = 0;
  int64_t max_new = 16;
  bool greedy = false, quiet = false;
  models::SamplingOptions sampling;
  // Filled from the flags.
  parallel::ModelConfig cfg;
  bool from_checkpoint = false;
  std::vector<models::GenerationRequest> reqs;
  std::vector<std::string> prompt_texts;  // as given ("" for token ids)
};

// A model directory whose tokenizer is not tessera's byte tokens (a BPE or
// SentencePiece vocabulary tessera does not read).
std::string foreign_tokenizer(const std::string& init) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::is_directory(init, ec) ? fs::path(init) : fs::path(init).parent_path();
  for (const char* f : {"tokenizer.json", "vocab.json", "tokenizer.model"})
    if (fs::exists(dir / f, ec)) return (dir / f).string();
  return "";
}

// Text prompts are byte tokens, as train_gpt's data (parallel/data/byte_dataset.h).
std::vector<int32_t> byte_tokens(const std::string& text, const Flags& f, const std::string& what) {
  TESSERA_ARG_CHECK(!text.empty(), what, " is empty");
  TESSERA_ARG_CHECK(f.cfg.vocab >= 256, what, ": text is tokenized as bytes (256 ids), but model '", f.cfg.name,
                    "' has a vocabulary of ", f.cfg.vocab, "; give --prompt-tokens");
  const std::string tok = foreign_tokenizer(f.init);
  TESSERA_ARG_CHECK(tok.empty(), what, ": ", f.init, " comes with its own tokenizer (", tok,
                    "), which tessera does not read; its ids are not bytes: give --prompt-tokens IDS instead");
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::vector<int32_t> parse_ids(const std::string& s, const std::string& what) {
  std::vector<int32_t> ids;
  // Ids separated by spaces or commas; every comma separates two ids ("1,,3",
  // "1, ,3" and "1,2," are typos, not [1, 3] or [1, 2]).
  const bool commas = s.find(',') != std::string::npos;
  for (size_t start = 0;;) {
    const size_t comma = s.find(',', start);
    std::istringstream in(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    std::string w;
    bool any = false;
    while (in >> w) {
      char* end = nullptr;
      const long long v = std::strtoll(w.c_str(), &end, 10);
      TESSERA_ARG_CHECK(end && *end == '\0' && v >= 0 && v <= INT32_MAX, what, ": '", w, "' is not a token id");
      ids.push_back(static_cast<int32_t>(v));
      any = true;
    }
    TESSERA_ARG_CHECK(any || !commas, what, ": '", s, "' has an empty id between commas");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  TESSERA_ARG_CHECK(!ids.empty(), what, " holds no token ids");
  return ids;
}

// Byte tokens as text (other ids as <id>).
std::string detok(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t t : ids) {
    if (t >= 0 && t < 256)
      s += static_cast<char>(t);
    else
      s += "<" + std::to_string(t) + ">";
  }
  return s;
}

// Text for the terminal: bytes outside printable ASCII as \xNN (the bytes of
// a small model's output are rarely UTF-8).
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 32 && c < 127 && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c));
      out += b;
    }
  }
  return out;
}

// A token for the stream: printable ASCII quoted, other bytes as \xNN, other ids as <id>.
std::string show(int32_t t) {
  char b[32];
  if (t >= 32 && t < 127 && t != '\'' && t != '\\')
    std::snprintf(b, sizeof b, "'%c'", static_cast<char>(t));
  else if (t >= 0 && t < 256)
    std::snprintf(b, sizeof b, "'\\x%02x'", static_cast<unsigned>(t));
  else
    std::snprintf(b, sizeof b, "<%d>", static_cast<int>(t));
  return b;
}

// What a JSON value is, in tessera's words (for messages; docs/errors.md).
std::string json_kind(const nlohmann::json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "the integer " + v.dump();
  if (v.is_number()) return "the number " + v.dump();
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// An integer field of a request in [lo, hi]; FormatError naming the line, the field and what it must be.
int64_t request_int(const nlohmann::json& v, const std::string& where, const std::string& key, int64_t lo, int64_t hi,
                    const char* must) {
  // (an unsigned value past int64's range is tested before it is read as int64)
  const bool ok = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) &&
                  v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  if (!ok)
    throw FormatError(tessera::detail::concat(where, ": field '", key, "' must be ", must, ", not ", json_kind(v)));
  return v.get<int64_t>();
}

// A request file: one JSON object per line, {"prompt": TEXT} or {"prompt_tokens": [IDS]}, with optional
// "max_new_tokens" (default --max-new-tokens) and "arrival_step" (default 0).
void read_requests(Flags& f) {
  const std::string text = read_input_file(f.requests, "--requests");
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> wheres;  // each request's file and line
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "--requests " + f.requests + " line " + std::to_string(n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw FormatError(tessera::detail::concat(where, ": not JSON (bad syntax at column ", e.byte,
                                                "); expected one object per line, e.g. {\"prompt\": \"Hello\", "
                                                "\"max_new_tokens\": 8}"));
    } catch (const nlohmann::json::exception& e) {  // a number out of range ("1e400")
      throw FormatError(tessera::detail::concat(where, ": not JSON (", tessera::json_library_text(e), ")"));
    }
    if (!j.is_object())
      throw FormatError(where + ": expected a JSON object such as {\"prompt\": \"Hello\"}, not " + json_kind(j));
    if (j.contains("prompt") && j.contains("prompt_tokens"))
      throw FormatError(where + ": give 'prompt' or 'prompt_tokens', not both");
    models::GenerationRequest r;
    r.max_new_tokens = f.max_new;
    for (const auto& [key, v] : j.items()) {
      if (key == "prompt") {
        if (!v.is_string()) throw FormatError(where + ": field 'prompt' must be a string (text), not " + json_kind(v));
        r.prompt = byte_tokens(v.get<std::string>(), f, where + ": field 'prompt'");
        f.prompt_texts.push_back(v.get<std::string>());
      } else if (key == "prompt_tokens") {
        if (!v.is_array())
          throw FormatError(where + ": field 'prompt_tokens' must be an array of token ids, not " + json_kind(v));
        for (size_t i = 0; i < v.size(); ++i)
          r.prompt.push_back(static_cast<int32_t>(request_int(v[i], where, "prompt_tokens[" + std::to_string(i) + "]",
                                                              0, INT32_MAX, "a token id (an integer >= 0)")));
        f.prompt_texts.emplace_back();
      } else if (key == "max_new_tokens") {
        r.max_new_tokens = request_int(v, where, key, 1, INT64_MAX, "a positive integer");
      } else if (key == "arrival_step") {
        r.arrival_step = request_int(v, where, key, 0, INT64_MAX, "an integer >= 0 (a decode step)");
      } else {
        throw FormatError(tessera::detail::concat(where, ": unknown field '", key,
                                                  "' (prompt, prompt_tokens, max_new_tokens, arrival_step)"));
      }
    }
    if (r.prompt.empty()) throw FormatError(where + ": needs a non-empty prompt or prompt_tokens");
    f.reqs.push_back(std::move(r));
    wheres.push_back(where);
  }
  if (f.reqs.empty()) throw FormatError("--requests " + f.requests + ": no requests");
  // What generate() would refuse for this model, said with the file and line
  // (once every line parsed: a syntax error is named first).
  for (size_t q = 0; q < f.reqs.size(); ++q) {
    const models::GenerationRequest& r = f.reqs[q];
    for (size_t i = 0; i < r.prompt.size(); ++i)
      if (r.prompt[i] >= f.cfg.vocab)
        throw FormatError(tessera::detail::concat(wheres[q], ": field 'prompt_tokens[", i, "]' is token id ",
                                                  r.prompt[i], ", outside the vocabulary [0, ", f.cfg.vocab,
                                                  ") of the model"));
    if (static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens > f.cfg.max_seq)
      throw FormatError(tessera::detail::concat(wheres[q], ": ", r.prompt.size(), " prompt tokens + max_new_tokens ",
                                                r.max_new_tokens, " exceed the model's context of ", f.cfg.max_seq,
                                                " tokens"));
  }
}

void build_requests(Flags& f) {
  if (!f.requests.empty()) {
    read_requests(f);
    return;
  }
  auto add = [&](std::vector<int32_t> ids, const std::string& text) {
    models::GenerationRequest r;
    r.prompt = std::move(ids);
    r.max_new_tokens = f.max_new;
    f.reqs.push_back(std::move(r));
    f.prompt_texts.push_back(text);
  };
  for (size_t i = 0; i < f.prompts.size(); ++i)
    add(byte_tokens(f.prompts[i], f, "--prompt " + std::to_string(i + 1)), f.prompts[i]);
  if (!f.prompt_file.empty()) {
    std::istringstream in(read_input_file(f.prompt_file, "--prompt-file"));
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
      if (!line.empty()) add(byte_tokens(line, f, f.prompt_file + " line " + std::to_string(n)), line);
  }
  for (size_t i = 0; i < f.prompt_tokens.size(); ++i)
    add(parse_ids(f.prompt_tokens[i], "--prompt-tokens " + std::to_string(i + 1)), "");
  TESSERA_ARG_CHECK(!f.reqs.empty(),
                    "no prompt: give --prompt TEXT, --prompt-file F, --prompt-tokens IDS or --requests F");
}

std::string us(double s) {
  char b[64];
  if (s >= 1e-3)
    std::snprintf(b, sizeof b, "%.3f ms", s * 1e3);
  else
    std::snprintf(b, sizeof b, "%.2f us", s * 1e6);
  return b;
}

std::string mib(double b) {
  char s[64];
  std::snprintf(s, sizeof s, "%.2f MiB", b / (1024.0 * 1024.0));
  return s;
}

// The planner's prediction for this run's layout (all prompts at step 0, the same --max-new-tokens).
struct Planned {
  bool valid = false;
  double ttft_s = 0, tpot_s = 0, kv_bytes = 0;
};

Planned planned(const Flags& f, int world) {
  Planned p;
  for (const auto& r : f.reqs)
    if (r.arrival_step != 0 || r.max_new_tokens != f.max_new) return p;
  if (f.max_batch > 0 && f.max_batch < static_cast<int>(f.reqs.size())) return p;
  TopologyOptions o;
  o.device = f.device;
  Topology topo = Topology::load(f.topology.empty() ? "emulated:" + std::to_string(world) : f.topology, o);
  if (topo.num_cores() != world) topo = topo.first_cores(world);
  parallel::InferenceConfig c;
  for (const auto& r : f.reqs) c.prompts.push_back(static_cast<int>(r.prompt.size()));
  c.generate = static_cast<int>(f.max_new);
  c.dtype = f.precision == "bf16" ? DType::BF16 : DType::F32;
  c.tp = f.tp;
  const parallel::InferencePlan plan = parallel::plan_inference(f.cfg, topo, c).at(0);
  p.valid = true;
  p.ttft_s = plan.ttft_s;
  p.tpot_s = plan.tpot_s;
  p.kv_bytes = plan.kv_bytes;
  return p;
}

int run_generate(const Flags& f, const gpt::Job& job) {
  const bool lead = job.world.rank == 0;
  TESSERA_ARG_CHECK(job.world.size == f.tp, "this job has ", job.world.size, " process(es) but --tp ", f.tp, " needs ",
                    f.tp);
  Device& dev = *job.device;
  const DType dt = f.precision == "bf16" ? DType::BF16 : DType::F32;
  dev.set_precision(dt, dt);
  parallel::layers::ParallelState ps =
      job.comm
          ? parallel::layers::make_parallel_state(job.comm, f.tp, 1, &dev, false, 1, models::kv_replicas(f.cfg, f.tp))
          : parallel::layers::serial_state(&dev);
  std::unique_ptr<models::CausalLM> model = models::make_causal_lm(f.cfg, ps);
  models::InferenceWeights weights(*model, &dev, dt);
  models::load_init_weights(*model, f.init, job.comm.get());
  weights.finish();
  const Planned plan = planned(f, job.world.size);
  std::unique_ptr<OutputStream> json;
  if (lead && !f.json.empty()) json = std::make_unique<OutputStream>(f.json);
  if (lead) {
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    std::string lens, news;  // per request (--requests gives each its own max_new_tokens)
    bool same_new = true;
    for (const auto& r : f.reqs) {
      lens += (lens.empty() ? "" : ",") + std::to_string(r.prompt.size());
      news += (news.empty() ? "" : ",") + std::to_string(r.max_new_tokens);
      same_new = same_new && r.max_new_tokens == f.reqs.front().max_new_tokens;
    }
    if (same_new) news = std::to_string(f.reqs.front().max_new_tokens);
    std::printf(
        "generate: %s '%s' (%.2fM params, vocab %d, context %d) from %s %s | tp=%d | device %s | %s | %zu prompt(s) "
        "of %s tokens, %s new | %s | OPENBLAS_CORETYPE=%s\n",
        f.cfg.family == "llama" ? "Llama" : "GPT-2", f.cfg.name.c_str(), f.cfg.total_params() / 1e6, f.cfg.vocab,
        f.cfg.max_seq, f.from_checkpoint ? "checkpoint" : "Hugging Face", f.init.c_str(), f.tp, f.device.c_str(),
        f.precision.c_str(), f.reqs.size(), lens.c_str(), news.c_str(), f.sampling.greedy ? "greedy" : "sampling",
        coretype ? coretype : "(unset)");
    std::fflush(stdout);
  }
  auto on_step = [&](const models::GenerationStep& s) {
    if (!lead || f.quiet) return;
    std::string line = "step " + std::to_string(s.step) + " batch " + std::to_string(s.batch);
    if (s.prefills) line += " (" + std::to_string(s.prefills) + " joining)";
    line += ":";
    for (size_t i = 0; i < s.requests.size(); ++i)
      line += " [" + std::to_string(s.requests[i]) + "] " + show(s.tokens[i]);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  const models::GenerationResult r = models::generate(*model, ps, f.reqs, f.sampling, f.max_batch, on_step);
  if (!lead) return 0;
  nlohmann::json seqs = nlohmann::json::array();
  for (size_t i = 0; i < f.reqs.size(); ++i) {
    const std::string text = detok(r.tokens[i]);
    const std::string prompt = f.prompt_texts[i].empty() ? "<" + std::to_string(f.reqs[i].prompt.size()) + " tokens> "
                                                         : printable(f.prompt_texts[i]);
    std::printf("[%zu] %s%s\n", i, prompt.c_str(), printable(text).c_str());
    seqs.push_back({{"prompt_tokens", f.reqs[i].prompt},
                    {"tokens", r.tokens[i]},
                    {"text", text},
                    {"first_step", r.first_step[i]}});
  }
  int64_t decoded = 0;
  double decode_wall = 0;
  nlohmann::json steps = nlohmann::json::array();
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const models::GenerationStep& s = r.steps[i];
    if (i > 0) {
      decoded += s.batch;
      decode_wall += s.wall_s;
    }
    steps.push_back({{"step", s.step},
                     {"batch", s.batch},
                     {"prefills", s.prefills},
                     {"wall_s", s.wall_s},
                     {"emulated_s", s.emulated_s}});
  }
  auto with_plan = [&](double v) { return plan.valid ? " (planned " + us(v) + ")" : std::string(); };
  std::printf("KV cache %s per rank%s, weights %s per rank\n", mib(static_cast<double>(r.kv_cache_bytes)).c_str(),
              plan.valid ? (" (planned " + mib(plan.kv_bytes) + ")").c_str() : "",
              mib(static_cast<double>(weights.bytes())).c_str());
  std::printf("time to first token: wall %s, emulated %s%s\n", us(r.ttft_wall_s()).c_str(),
              us(r.ttft_emulated_s()).c_str(), with_plan(plan.ttft_s).c_str());
  if (r.steps.size() > 1)
    std::printf("time per output token: wall %s, emulated %s%s; decode %.1f tokens/s (wall)\n",
                us(r.tpot_wall_s()).c_str(), us(r.tpot_emulated_s()).c_str(), with_plan(plan.tpot_s).c_str(),
                decode_wall > 0 ? static_cast<double>(decoded) / decode_wall : 0.0);
  std::fflush(stdout);
  if (json) {
    nlohmann::json j{{"model", f.cfg.name},
                     {"family", f.cfg.family},
                     {"tp", f.tp},
                     {"device", f.device},
                     {"precision", f.precision},
                     {"sequences", seqs},
                     {"steps", steps},
                     {"kv_cache_bytes", r.kv_cache_bytes},
                     {"weight_bytes", weights.bytes()},
                     {"ttft_wall_s", r.ttft_wall_s()},
                     {"ttft_emulated_s", r.ttft_emulated_s()},
                     {"tpot_wall_s", r.tpot_wall_s()},
                     {"tpot_emulated_s", r.tpot_emulated_s()}};
    if (plan.valid) {
      j["planned_ttft_s"] = plan.ttft_s;
      j["planned_tpot_s"] = plan.tpot_s;
      j["planned_kv_cache_bytes"] = plan.kv_bytes;
    }
    json->write(j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    json->close();
  }
  return 0;
}

int run(int argc, char** argv) {
  kern::default_blas_threads();
  Flags f;
  CLI::App app{"Generate text with a KV cache on emulated cores, the model tensor-parallel over the ranks", "generate"};
  app.add_option("--init", f.init,
                 "the model: a tessera checkpoint directory (or a --save directory: its newest), or a Hugging Face "
                 "safetensors file or model directory")
      ->required()
      ->check(CLI::ExistingPath);
  app.add_option("--model", f.model,
                 "the model --init must hold (a preset, model JSON or Hugging Face config.json); refused otherwise");
  app.add_option("--tp", f.tp, "tensor-parallel degree (the job's world size)")->check(cli::positive(f.tp));
  app.add_option("--prompt", f.prompts, "a prompt (text: byte tokens); repeat for a batch");
  app.add_option("--prompt-file", f.prompt_file, "prompts, one per line")->check(CLI::ExistingFile);
  app.add_option("--prompt-tokens", f.prompt_tokens,
                 "a prompt as token ids, e.g. 464,2068,7586 (for a tokenizer tessera does not read); repeatable");
  app.add_option("--requests", f.requests,
                 "continuous batching: one JSON object per line, {\"prompt\": TEXT | \"prompt_tokens\": [IDS], "
                 "\"max_new_tokens\": N, \"arrival_step\": S}")
      ->check(CLI::ExistingFile);
  app.add_option("--max-batch", f.max_batch, "sequences decoded at once (0: every request)")
      ->check(cli::non_negative(f.max_batch));
  app.add_option("--max-new-tokens", f.max_new, "new tokens per sequence")
      ->check(cli::positive(int32_t{}));  // held in 32 bits downstream
  auto* greedy = app.add_flag("--greedy", f.greedy, "pick the most likely token (the default)");
  auto* temp = app.add_option("--temperature", f.sampling.temperature, "sample: divide the logits by T")
                   ->check(cli::number_range(1e-6, 1e6));
  auto* topk = app.add_option("--top-k", f.sampling.top_k, "sample among the K most likely tokens (0: all)")
                   ->check(cli::non_negative(f.sampling.top_k));
  auto* topp = app.add_option("--top-p", f.sampling.top_p, "sample among the most likely tokens of probability P")
                   ->check(cli::number_range(1e-6, 1.0));
  auto* seed = app.add_option("--seed", f.sampling.seed, "sampling seed (the same tokens in every layout)")
                   ->check(cli::any_int(f.sampling.seed));
  for (auto* o : {temp, topk, topp, seed}) greedy->excludes(o);
  app.add_option("--json", f.json, "write the tokens, texts and timings to FILE");
  app.add_option("--device", f.device, "emulated core (default trn1-core, or the --topology's)")
      ->check(CLI::IsMember(DeviceSpec::preset_names()));
  app.add_option("--topology", f.topology,
                 "place the ranks on this topology's first cores (a `tessera plan` preset or JSON file) and charge "
                 "the collectives on its links (default emulated:N)");
  app.add_option("--precision", f.precision, "fp32, or bf16 weights, activations and KV cache")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_flag("--quiet", f.quiet, "do not stream each step's tokens");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return cli::kUsageExit;
  }
  f.sampling.greedy =
      !(app.count("--temperature") || app.count("--top-k") || app.count("--top-p") || app.count("--seed"));
  gpt::RankPlacement placed;  // --topology: the TP groups' links
  try {
    TESSERA_ARG_CHECK(f.requests.empty() || (f.prompts.empty() && f.prompt_file.empty() && f.prompt_tokens.empty()),
                      "--requests holds the prompts: not with --prompt, --prompt-file or --prompt-tokens");
    TESSERA_ARG_CHECK(f.max_batch == 0 || !f.requests.empty(), "--max-batch needs --requests");
    if (f.device.empty()) {
      f.device = "trn1-core";
      if (!f.topology.empty() && !Topology::is_emulated(f.topology))
        f.device = Topology::load(f.topology).device().name;
    }
    f.cfg = models::init_model_config(f.init, &f.from_checkpoint);
    if (!f.model.empty()) {
      parallel::ModelConfig want = gpt::resolve_model_arg(f.model);
      models::complete_model_config(want);
      const std::string diff = models::model_differences(f.cfg, want, "it", "--model " + f.model);
      TESSERA_ARG_CHECK(diff.empty(), "--init ", f.init, " holds another model than --model ", f.model, ":", diff);
    }
    models::validate_layout(f.cfg, f.tp);
    build_requests(f);
    const World w = discover_world();
    if (w.rank == 0 && !f.json.empty()) cli::check_output_file("--json", f.json);
    // One rank per TP rank (the same check the job makes once joined, said before the mesh is built).
    TESSERA_ARG_CHECK(w.size == f.tp, "--tp ", f.tp, " needs ", f.tp, " processes, one per rank, and this job has ",
                      w.size, ": start it with `tessera run --nproc-per-node ", f.tp,
                      " -- generate ...` or `mpirun -np ", f.tp, " generate ...`");
    TopologyOptions o;
    o.device = f.device;
    placed = gpt::place_ranks(f.topology, o, parallel::Mesh({.tp = f.tp, .dp = w.size / f.tp, .pp = 1}), w.size);
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "generate: %s\nRun with --help for more information.\n", e.what());
    return cli::kUsageExit;
  } catch (const FormatError& e) {
    std::fprintf(stderr, "generate: %s\n", e.what());
    return cli::kUsageExit;
  }
  return gpt::run_job(
      f.device,
      [&](const gpt::Job& job) {
        try {
          return run_generate(f, job);
        } catch (const InvalidArgument& e) {
          std::fprintf(stderr, "generate: %s\n", e.what());
          return cli::kUsageExit;
        }
      },
      placed.net, placed.nodes);
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_main("generate", [&] { return run(argc, argv); });
}
