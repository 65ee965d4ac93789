// Training checkpoints: every rank's shard of the parameters and of the AdamW
// moments, saved in parallel and loaded back under the same or another
// (tp, dp, pp, ZeRO-1) layout. docs/checkpoint.md gives the format.
//
// Directory of one checkpoint (built as ROOT/.step_NNNNNNNN.tmp, renamed into
// place once every rank's file is written and fsynced, marker written last):
//   ROOT/step_NNNNNNNN/dp_rank_XX_tp_rank_YY_pp_rank_ZZ.safetensors  one per rank
//   ROOT/step_NNNNNNNN/trainer_state.cereal                          the trainer's own state (opaque here)
//   ROOT/step_NNNNNNNN/manifest.json     layout, every tensor's global shape, every piece, every file's SHA-256
//   ROOT/step_NNNNNNNN/done              the done marker: the manifest's SHA-256 (written last)
//
// What is stored is described by parameter name, so that a rank (or a
// pipeline stage) holding any subset of the parameters saves and loads
// exactly its own. A piece is a range [begin, end) of the row-major
// flattening of one TP shard (a Parameter descriptor: full shape, split dim,
// chunks, tp, tp_rank) of one tensor, of one kind (the parameter, exp_avg or
// exp_avg_sq), stored as a 1-D F32 safetensors tensor "<kind>/<name>".
// Every element of every (tensor, kind) is in exactly one piece (checked at
// load). Who writes what: under ZeRO-1 each rank its own slice (values and
// moments); under plain DP DP rank d the d-th of dp equal ranges of its TP
// shard (so the dp replicas write in parallel); tensors replicated over TP
// only from TP rank 0.
//
// Errors: FormatError "checkpoint DIR: ..." naming the file and the tensor
// for anything damaged or inconsistent, detected before a byte of tensor data
// is used; InvalidArgument for a checkpoint that does not fit the model;
// IoError (runtime/files.h) or Error for a failed save. Collective calls
// (save_train_checkpoint, verify_collective) must be made by every rank of
// `world` in the same order; a failure on one rank is raised on all of them
// with that rank's message, so no rank loads or finishes a save alone.
// TrainCheckpoint is immutable after construction except for its lazily
// opened readers; one thread per object.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "parallel/checkpoint/hf_gpt2.h"
#include "parallel/layers/parameter.h"

namespace tessera::parallel::checkpoint {

class SafetensorsReader;

constexpr const char* kTrainFormat = "tessera-train-checkpoint";
constexpr int kTrainVersion = 1;
constexpr const char* kTrainManifestName = "manifest.json";
constexpr const char* kTrainerStateName = "trainer_state.cereal";
constexpr const char* kDoneMarkerName = "done";

enum class StateKind { Param = 0, ExpAvg = 1, ExpAvgSq = 2 };
const char* state_kind_name(StateKind k);  // "param", "exp_avg", "exp_avg_sq"

struct TrainLayout {
  int tp = 1, dp = 1, pp = 1;
  bool zero1 = false;
  bool sequence_parallel = false;
};

// "step_00000042".
std::string step_dir_name(int64_t step);

// One tensor as this rank holds it: the bound Parameter (its TP shard) and
// the range of the shard whose AdamW moments this rank keeps (m[i], v[i]
// belong to element moment_begin + i; the whole shard under plain DP).
struct HeldTensor {
  parallel::layers::Parameter* param = nullptr;
  int64_t moment_begin = 0, moment_end = 0;
  float* m = nullptr;
  float* v = nullptr;
  // false: a copy that another rank saves (for pipeline parallelism, the
  // tied embedding a last stage holds besides stage 0), so that every element
  // is stored exactly once.
  bool save = true;
};

struct SaveSpec {
  std::string root;  // --save DIR
  int64_t step = 0;
  std::string run_id;
  TrainLayout layout;
  int tp_rank = 0, dp_rank = 0, pp_rank = 0, world_rank = 0;
  std::map<std::string, int64_t> model;  // the model config, recorded in the manifest
  std::string trainer_state;             // bytes of trainer_state.cereal (world rank 0's are written)
  int keep = 0;                          // > 0: keep the newest `keep` complete checkpoints
};

struct SaveResult {
  std::string dir;     // ROOT/step_NNNNNNNN
  uint64_t bytes = 0;  // of every file written, all ranks
};

// Collective over `world` (nullptr: a single process). Writes this rank's
// file, then (world rank 0) the trainer state, the manifest, the rename and
// the marker, then applies --keep. A failure anywhere leaves the previous
// checkpoints as they were and is raised on every rank.
SaveResult save_train_checkpoint(collectives::Communicator* world, const std::vector<HeldTensor>& held,
                                 const SaveSpec& spec);

// Complete checkpoints (with their done marker) under `root`, by step ascending.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& root);
// The newest complete checkpoint under `root`, or nullopt.
std::optional<std::string> latest_checkpoint(const std::string& root);
// True when `dir` holds a training checkpoint's manifest (complete or not).
bool is_train_checkpoint(const std::string& dir);

struct TensorInfo {
  Shape shape;
};

struct PieceInfo {
  std::string tensor;
  StateKind kind = StateKind::Param;
  std::string key;  // name in the file
  int split_dim = -1, chunks = 1, tp = 1, tp_rank = 0;
  Shape shard_shape;
  int64_t begin = 0, end = 0;
  size_t file = 0;  // index into files()
};

struct FileInfo {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  std::string sha256;
  int rank = 0;
};

class TrainCheckpoint {
 public:
  // Opens the checkpoint directory `dir` (a step directory): refuses one
  // without its done marker or whose marker does not hold the manifest's
  // SHA-256, then validates the manifest: structure, file names, every piece
  // against its tensor (shard shape from its split, range inside the shard),
  // and that every element of every (tensor, kind) is in exactly one piece.
  // Reads no tensor data. FormatError "checkpoint DIR: ...".
  explicit TrainCheckpoint(const std::string& dir);
  ~TrainCheckpoint();
  TrainCheckpoint(const TrainCheckpoint&) = delete;
  TrainCheckpoint& operator=(const TrainCheckpoint&) = delete;

  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }
  const std::string& run_id() const { return run_id_; }
  const TrainLayout& layout() const { return layout_; }
  const std::map<std::string, int64_t>& model() const { return model_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::vector<FileInfo>& files() const { return files_; }
  const std::vector<PieceInfo>& pieces() const { return pieces_; }
  bool has_kind(StateKind k) const;

  // The trainer state file's bytes (size and SHA-256 checked first).
  std::string read_trainer_state() const;
  // Checks file `i`: a regular file of the recorded size and SHA-256, a valid
  // safetensors file holding exactly the manifest's pieces (F32, [end -
  // begin]) with this checkpoint's run id and step in its metadata.
  void verify_file(size_t i) const;
  // Every file (what `tessera ckpt verify` runs); returns the bytes checked.
  uint64_t verify_all() const;
  // Collective over `world` (nullptr: alone): rank r checks files r, r + W,
  // ...; a damaged file is raised on every rank with the checking rank's message.
  void verify_collective(collectives::Communicator* world) const;

  // Fills dst[0, end - begin) with the elements [begin, end) of the TP shard
  // `dest` (its name, full shape and split; value pointers unused) of `kind`,
  // from whichever pieces hold them (any source layout); padding gets 0.
  // Files must have been verified (verify_file/verify_collective). Throws
  // FormatError when the checkpoint lacks the tensor, InvalidArgument when
  // its global shape differs from dest's.
  void read(const parallel::layers::Parameter& dest, StateKind kind, int64_t begin, int64_t end, float* dst) const;

 private:
  void open(const std::string& dir);
  const SafetensorsReader& reader(size_t file) const;
  std::string where() const { return "checkpoint " + dir_; }

  std::string dir_;
  int64_t step_ = 0;
  std::string run_id_;
  TrainLayout layout_;
  std::map<std::string, int64_t> model_;
  std::map<std::string, TensorInfo> tensors_;
  std::vector<FileInfo> files_;
  FileInfo state_file_;
  std::vector<PieceInfo> pieces_;
  std::map<std::pair<std::string, int>, std::vector<size_t>> by_tensor_;  // (tensor, kind) -> pieces
  mutable std::map<size_t, std::unique_ptr<SafetensorsReader>> readers_;
};

// Writes the checkpoint's weights as one Hugging Face GPT-2 safetensors file
// (write_gpt2_safetensors; the model config from the manifest), after
// verify_all(). with_optimizer adds "optimizer.exp_avg.<name>" and
// "optimizer.exp_avg_sq.<name>" tensors (full shapes) beside the weights.
// Refuses an existing out_file (InvalidArgument); FormatError naming the
// checkpoint, file and tensor for anything damaged.
void consolidate_train_checkpoint(const std::string& dir, const std::string& out_file, bool with_optimizer);

// The training checkpoint `path` names: `path` itself when it holds a
// training manifest (complete or not; opening it checks the marker), else
// the newest complete checkpoint under `path` (a --save directory), else nullopt.
std::optional<std::string> resolve_train_checkpoint(const std::string& path);

// The GPT-2 config of a training checkpoint (its manifest's model), after
// checking that its tensors are exactly that config's GPT-2 tensors with
// their shapes. FormatError "checkpoint DIR: ..." naming the tensor.
Gpt2Config train_checkpoint_gpt2_config(const TrainCheckpoint& ck);

struct RelayoutOptions {
  TrainLayout layout;         // the new layout (zero1 and sequence_parallel are recorded)
  std::vector<int> stages;    // layers per pp stage; empty: gpt2_stages' default
  std::string trainer_state;  // bytes of the new trainer_state.cereal; empty: the source's
  bool allow_nonfinite = false;
};

// `tessera ckpt reshard` of a training checkpoint: the checkpoint `src` (a
// step directory), every hash checked first (verify_all), written into the
// existing empty directory `dir` as a complete checkpoint (done marker
// last) of the same run and step in `o.layout`: one file per (dp, tp, pp)
// rank holding, of every tensor of its stage, the dp_rank-th of dp equal
// ranges of its TP shard (parameter, exp_avg, exp_avg_sq; tensors
// replicated over TP from TP rank 0), which is what save writes under plain
// DP; a resume re-slices it for ZeRO-1. Streams (8 MiB reads). Returns the
// bytes written. InvalidArgument for a layout that does not fit the model,
// FormatError for a damaged checkpoint or non-finite weights.
uint64_t relayout_train_checkpoint(const std::string& src, const std::string& dir, const RelayoutOptions& o);

// Fault injection for tests: when the environment has
// TESSERA_CKPT_FAULT=<point> (and TESSERA_CKPT_FAULT_RANK, default 0, is this
// world rank; TESSERA_CKPT_FAULT_STEP, default any, is the step saved), the
// process SIGKILLs itself at that point of save_train_checkpoint. Points:
// mid_file (half of this rank's file written), file_written, before_rename,
// before_marker, before_keep, mid_keep (an old checkpoint's marker removed,
// its files not yet).
void fault_point(const char* point, int world_rank, int64_t step);

}  // namespace tessera::parallel::checkpoint
