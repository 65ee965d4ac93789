// The one checkpoint format of tessera: every rank's shard of the parameters
// (and, for a training run, of the AdamW moments), written in parallel and
// read back under the same or another (tp, dp, pp, ZeRO-1) layout. What
// `train_gpt --save` writes, what `tessera ckpt shard` and `reshard` write
// (parameters only: no moments, no trainer state), what `consolidate`,
// `verify` and a resume read. docs/checkpoint.md gives the format.
//
// The layer knows tensors, rectangles, dtypes and files, nothing of any
// model: a model family hands it descriptors (parallel::layers::Parameter:
// name, full shape, this rank's shard, its replica and its layer) through a
// ModelLayout, and an opaque model description that the manifest records.
//
// Directory of one checkpoint (built in a temp directory, committed by
// runtime/files.h's commit_directory, marker written last):
//   DIR/dp_rank_XX_tp_rank_YY_pp_rank_ZZ.safetensors   one per rank that writes something
//   DIR/trainer_state.cereal   the trainer's own state (opaque here; training checkpoints only)
//   DIR/manifest.json          model, layout, every tensor's shape and dtype, every piece, every file's SHA-256
//   DIR/done                   the manifest's SHA-256 (written last)
//
// A piece is a range [begin, end) of the row-major flattening of one TP
// shard (a descriptor) of one tensor, of one kind (the parameter, exp_avg,
// exp_avg_sq or, for bf16 parameters with fp32 master weights, master),
// stored as a 1-D tensor "<kind>/<name>": the parameter in the tensor's
// dtype (F32, BF16 or F16, kept byte for byte), the optimizer's state in F32. Every element of every (tensor,
// kind) is in exactly one piece. Who writes: replica 0 of a shard
// (tp_replica() == 0: tensors replicated over TP from TP rank 0, KV heads
// replicated when tp exceeds them from the first rank of each group), and
// of the DP replicas, under ZeRO-1 each rank its own slice, under plain DP
// DP rank d the d-th of dp equal ranges, so the replicas write in parallel.
//
// Errors: FormatError "checkpoint DIR: ..." naming the file and the tensor
// for anything damaged or inconsistent, detected before a byte of tensor
// data is used; InvalidArgument for a checkpoint that does not fit the
// model; IoError (runtime/files.h) or Error for a failed save. Collective
// calls (save_checkpoint, verify_collective) must be made by every rank of
// `world` in the same order; a failure on one rank is raised on all of them.
// Checkpoint is immutable after construction except for its lazily opened
// readers; one thread per object.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "parallel/layers/parameter.h"
#include "runtime/dtype.h"

namespace tessera {
class FileOps;  // runtime/files.h
}  // namespace tessera

namespace tessera::parallel::checkpoint {

class SafetensorsReader;
class TensorSource;

constexpr const char* kFormat = "tessera-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kManifestName = "manifest.json";
constexpr const char* kTrainerStateName = "trainer_state.cereal";
constexpr const char* kDoneMarkerName = "done";
// Formats of earlier builds, refused with the command that regenerates them.
constexpr const char* kOldShardFormat = "tessera-gpt2-tp-pp-shards";
constexpr const char* kOldTrainFormat = "tessera-train-checkpoint";

enum class StateKind { Param = 0, ExpAvg = 1, ExpAvgSq = 2, Master = 3 };
const char* state_kind_name(StateKind k);  // "param", "exp_avg", "exp_avg_sq", "master"
// The optimizer's kinds are stored in F32 whatever the parameter's dtype.
inline bool optimizer_kind(StateKind k) { return k != StateKind::Param; }

struct Layout {
  int tp = 1, dp = 1, pp = 1;
  bool zero1 = false;
  bool sequence_parallel = false;
  std::vector<int> stages;  // layers per pp stage; empty: parallel/pipeline/partition.h's rule
};

// ---- what a model family supplies ---------------------------------------------

// The tensors of one model, as a family lays them out (implemented in
// parallel/models/<family>/). Pure; thread-safe.
class ModelLayout {
 public:
  virtual ~ModelLayout() = default;
  // The description the manifest records (JSON text; opaque to this layer).
  virtual std::string model_json() const = 0;
  // One line naming the model, for messages.
  virtual std::string describe() const = 0;
  // Transformer layers (pipeline stages take whole layers).
  virtual int64_t layers() const = 0;
  // Every tensor TP rank `tp_rank` of `tp` holds (all pipeline stages),
  // unbound, in the order a consolidated file lists them. Throws
  // InvalidArgument naming the numbers when tp cannot split the model.
  virtual std::vector<parallel::layers::Parameter> tensors(int tp, int tp_rank) const = 0;
  // __metadata__ of a consolidated file whose weights are stored as
  // `weights` (Hugging Face's format=pt and the config).
  virtual std::map<std::string, std::string> file_metadata(DType weights) const = 0;
  // Small files beside a consolidated Hugging Face directory whose weights
  // are stored as `weights`: (name, bytes), e.g. config.json.
  virtual std::vector<std::pair<std::string, std::string>> hf_files(DType /*weights*/) const { return {}; }
};

// The layout of a recorded model description; FormatError naming `where`
// when the description is not one the families know.
using LayoutFactory =
    std::function<std::unique_ptr<ModelLayout>(const std::string& model_json, const std::string& where)>;

// Pipeline stage of a descriptor under `stages` (layers per stage): its
// layer's stage, the first for kEmbeddingLayer, the last for kHeadLayer.
int stage_of(const parallel::layers::Parameter& p, const std::vector<int>& stages);

// ---- readers --------------------------------------------------------------------

// Anything the writer can read shards from: a checkpoint (any layout) or a
// Hugging Face file (every tensor whole).
class TensorReader {
 public:
  virtual ~TensorReader() = default;
  virtual std::string where() const = 0;
  // Stored dtype of a tensor's parameter (F32, BF16 or F16); FormatError when absent.
  virtual DType dtype(const std::string& tensor) const = 0;
  // Stored dtype of `kind` of a tensor: dtype(tensor) for the parameter, F32 for the optimizer's state.
  DType kind_dtype(const std::string& tensor, StateKind kind) const {
    return optimizer_kind(kind) ? DType::F32 : dtype(tensor);
  }
  virtual bool has_kind(StateKind k) const = 0;
  // The optimizer's kinds this reader holds, in file order: exp_avg,
  // exp_avg_sq, and master when it has master weights.
  std::vector<StateKind> optimizer_kinds() const;
  // Elements [begin, end) of the TP shard `dest` (name, full shape and
  // split; value pointers unused) of `kind`, in kind_dtype(dest.name, kind), into dst;
  // padding gets zeros. Reads only the byte ranges it needs (pread).
  virtual void read(const parallel::layers::Parameter& dest, StateKind kind, int64_t begin, int64_t end,
                    void* dst) const = 0;
};

// A Hugging Face file or sharded directory as whole tensors: descriptor
// name -> the name stored in `src` (a family's lenient reading). `src` must
// outlive it.
class WholeTensors : public TensorReader {
 public:
  WholeTensors(const TensorSource& src, std::map<std::string, std::string> stored_names);
  std::string where() const override;
  DType dtype(const std::string& tensor) const override;
  bool has_kind(StateKind k) const override { return k == StateKind::Param; }
  void read(const parallel::layers::Parameter& dest, StateKind kind, int64_t begin, int64_t end,
            void* dst) const override;

 private:
  const TensorSource& src_;
  std::map<std::string, std::string> stored_;
};

struct TensorInfo {
  Shape shape;
  DType dtype = DType::F32;
  int layer = parallel::layers::kEmbeddingLayer;  // the descriptor's (its pipeline stage follows)
};

struct PieceInfo {
  std::string tensor;
  StateKind kind = StateKind::Param;
  std::string key;  // name in the file
  int split_dim = -1, chunks = 1, tp = 1, tp_rank = 0, tp_parts = 1;
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

class Checkpoint : public TensorReader {
 public:
  // Opens the checkpoint directory `dir`: refuses one without its done
  // marker or whose marker does not hold the manifest's SHA-256 (and the
  // formats of earlier builds, saying how to regenerate them), then
  // validates the manifest: structure, file names, every piece against its
  // tensor (shard shape from its split, range inside the shard), and that
  // every element of every (tensor, kind) is in exactly one piece. Reads no
  // tensor data. FormatError "checkpoint DIR: ...".
  explicit Checkpoint(const std::string& dir);
  ~Checkpoint() override;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& dir() const { return dir_; }
  std::string where() const override { return "checkpoint " + dir_; }
  int64_t step() const { return step_; }
  const std::string& run_id() const { return run_id_; }
  const Layout& layout() const { return layout_; }
  const std::string& model_json() const { return model_json_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::vector<FileInfo>& files() const { return files_; }
  const std::vector<PieceInfo>& pieces() const { return pieces_; }
  bool has_kind(StateKind k) const override;
  DType dtype(const std::string& tensor) const override;
  bool has_trainer_state() const { return !state_file_.name.empty(); }

  // The trainer state file's bytes (size and SHA-256 checked first);
  // FormatError when the checkpoint has none.
  std::string read_trainer_state() const;
  // The recorded model against `model` (the layout of model_json()): the
  // tensors are exactly model.tensors(1, 0) with their shapes, and every
  // piece's split, chunks, parts and shard shape are what model.tensors(tp,
  // tp_rank) gives for its rank. FormatError naming the tensor.
  void verify_model(const ModelLayout& model) const;
  // Checks file `i`: a regular file of the recorded size and SHA-256, a valid
  // safetensors file holding exactly the manifest's pieces (dtype, [end -
  // begin]) with this checkpoint's run id, step and model in its metadata.
  void verify_file(size_t i) const;
  // Every file (what `tessera ckpt verify` runs); returns the bytes checked.
  uint64_t verify_all() const;
  // Collective over `world` (nullptr: alone): rank r checks files r, r + W,
  // ...; a damaged file is raised on every rank with the checking rank's message.
  void verify_collective(collectives::Communicator* world) const;

  // TensorReader: files must have been verified. FormatError when the
  // checkpoint lacks the tensor or kind, InvalidArgument when its shape
  // differs from dest's.
  void read(const parallel::layers::Parameter& dest, StateKind kind, int64_t begin, int64_t end,
            void* dst) const override;
  // read() converted to fp32 (for loading into a model).
  void read_f32(const parallel::layers::Parameter& dest, StateKind kind, int64_t begin, int64_t end, float* dst) const;

 private:
  void open(const std::string& dir);
  const SafetensorsReader& reader(size_t file) const;

  std::string dir_;
  int64_t step_ = 0;
  std::string run_id_;
  Layout layout_;
  std::string model_json_;
  std::map<std::string, TensorInfo> tensors_;
  std::vector<FileInfo> files_;
  FileInfo state_file_;
  std::vector<PieceInfo> pieces_;
  std::map<std::pair<std::string, int>, std::vector<size_t>> by_tensor_;  // (tensor, kind) -> pieces
  mutable std::map<size_t, std::unique_ptr<SafetensorsReader>> readers_;
};

// ---- writers --------------------------------------------------------------------

// "step_00000042".
std::string step_dir_name(int64_t step);
// "dp_rank_00_tp_rank_01_pp_rank_00.safetensors" (NxD's naming).
std::string rank_file_name(int dp_rank, int tp_rank, int pp_rank);

// One tensor as this rank holds it: the bound Parameter (its TP shard) and
// the range of the shard whose AdamW moments this rank keeps (m[i], v[i]
// belong to element moment_begin + i; the whole shard under plain DP).
// `dtype`: how the parameter is stored (BF16: param->value holds bf16
// values, written as 16-bit); `master`: its fp32 master weights over the
// moments' range (bf16 parameters with master weights), else nullptr.
struct HeldTensor {
  parallel::layers::Parameter* param = nullptr;
  int64_t moment_begin = 0, moment_end = 0;
  float* m = nullptr;
  float* v = nullptr;
  float* master = nullptr;
  DType dtype = DType::F32;
  // false: a copy that another rank saves (the tied embedding a last
  // pipeline stage holds besides stage 0), so every element is stored once.
  bool save = true;
};

struct SaveSpec {
  std::string root;  // --save DIR
  int64_t step = 0;
  std::string run_id;
  Layout layout;
  int tp_rank = 0, dp_rank = 0, pp_rank = 0, world_rank = 0;
  std::string model_json;     // the model description, recorded in the manifest
  std::string trainer_state;  // bytes of trainer_state.cereal (world rank 0's are written)
  int keep = 0;               // > 0: keep the newest `keep` complete checkpoints
  FileOps* ops = nullptr;     // every file step of the save (tests: fault injection); nullptr: posix
};

struct SaveResult {
  std::string dir;     // ROOT/step_NNNNNNNN
  uint64_t bytes = 0;  // of every file written, all ranks
};

// Collective over `world` (nullptr: a single process). Writes this rank's
// file into ROOT/.step_NNNNNNNN.tmp, then (world rank 0) the trainer state,
// the manifest, the directory commit and the marker, then applies --keep.
// A failure anywhere leaves the previous checkpoints as they were and is
// raised on every rank: a step directory whose marker could not be written
// (a full disk) is removed, not left to hold the space the next save needs,
// and a checkpoint of the same step it was replacing is put back.
SaveResult save_checkpoint(collectives::Communicator* world, const std::vector<HeldTensor>& held, const SaveSpec& spec);

struct WriteOptions {
  Layout layout;
  bool optimizer = false;  // also exp_avg, exp_avg_sq and any master weights (the source must hold the moments)
  std::string run_id;      // recorded (and in every file's metadata)
  int64_t step = 0;
  std::string trainer_state;  // empty: none
  bool allow_nonfinite = false;
};

// Writes a complete checkpoint of `model` in o.layout, read from `src`, as
// the new directory `out_dir` (must not exist, or be empty; built in a temp
// sibling and committed): one file per (dp, tp, pp) rank holding, of every
// tensor of its stage, the dp_rank-th of dp equal ranges of its TP shard
// (replica 0's only), which is what save writes under plain DP; a resume
// re-slices it for ZeRO-1. Streams: 8 MiB reads, O_DIRECT outputs hashed on
// a second thread. Returns the bytes written. InvalidArgument for a layout
// that does not fit the model, FormatError for non-finite weights.
uint64_t write_checkpoint(const TensorReader& src, const ModelLayout& model, const std::string& out_dir,
                          const WriteOptions& o);

// Writes `model`'s tensors read from `src` whole, in model.tensors(1, 0)'s
// order and their stored dtype, with model.file_metadata() plus `extra`:
// max_shard_bytes == 0: one safetensors file `out` (must not exist); else a
// Hugging Face directory `out` (must not exist or be empty):
// model-0000K-of-0000N.safetensors, a new file whenever the next tensor
// would take this one past max_shard_bytes of tensor data, and
// model.safetensors.index.json (only model.safetensors when one file
// suffices), plus model.hf_files(). with_optimizer adds
// "optimizer.exp_avg.<name>" and "optimizer.exp_avg_sq.<name>" after the
// weights (and "optimizer.master.<name>" when the source has master
// weights), all F32. Returns the file names written.
std::vector<std::string> consolidate(const TensorReader& src, const ModelLayout& model, const std::string& out,
                                     uint64_t max_shard_bytes, bool with_optimizer, bool allow_nonfinite,
                                     const std::map<std::string, std::string>& extra = {});

// Complete checkpoints (with their done marker) under `root`, by step ascending.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& root);
// The newest complete checkpoint under `root`, or nullopt.
std::optional<std::string> latest_checkpoint(const std::string& root);
// The checkpoint `path` names: `path` itself when it holds a manifest of
// this format, else the newest complete checkpoint under `path` (a --save
// directory), else nullopt. A manifest of an earlier build's format is a
// FormatError saying how to regenerate it.
std::optional<std::string> resolve_checkpoint(const std::string& path);
// FormatError for a manifest.json in `dir` of an earlier build's format
// (the message gives the command that regenerates it); else nothing.
void refuse_old_format(const std::string& dir);

// Fault injection for tests: when the environment has
// TESSERA_CKPT_FAULT=<point> (and TESSERA_CKPT_FAULT_RANK, default 0, is this
// world rank; TESSERA_CKPT_FAULT_STEP, default any, is the step saved), the
// process SIGKILLs itself at that point. Points of save_checkpoint: mid_file
// (half of this rank's file written), file_written, before_rename,
// before_marker, before_keep, mid_keep (an old checkpoint's marker removed,
// its files not yet); of write_checkpoint and consolidate: mid_output
// (half of the files written), before_commit.
void fault_point(const char* point, int world_rank, int64_t step);

}  // namespace tessera::parallel::checkpoint
