// One atomic file write for the whole tree (checkpoints, plans, manifests,
// the FileStore's keys).
//
// Contract of write_file_atomic(path, ...):
//  1. create a temp file with a unique name in path's directory
//     (".<name>.tmp.<pid>.XXXXXX", O_CREAT|O_EXCL, as mkstemp does; mode 0666
//     less the umask unless AtomicWriteOptions::mode says otherwise), and
//     hold an flock on it while writing; a durable write (sync) first removes
//     the temps that dead processes left in that directory, of `path` or
//     another output (remove_dead_output_temps);
//  2. write the bytes (short writes are continued, EINTR retried);
//  3. fsync the temp file, then close it;
//  4. rename it over `path` (atomic on POSIX: a reader sees the old file or
//     the new one, never a mix);
//  5. fsync path's directory, so the rename itself survives a crash.
// A failure at steps 1-4 removes the temp file and leaves `path` as it was
// (the old file, or no file). A failure at step 5 comes after the rename:
// `path` is the new file but may not survive a power loss; the call still
// throws. Either way no temp file is left behind. Concurrent writers of one
// path (threads or processes) each use their own temp file, so the last
// rename wins and the file is always one writer's whole content.
//
// Errors: IoError (a tessera::Error) naming the path, the step that failed
// and the OS error text, e.g. "/ckpt/a.safetensors: cannot fsync the temp
// file /ckpt/.a.safetensors.tmp.4711.Qx81Zp: No space left on device". An
// exception thrown by a streaming writer's callback propagates unchanged
// (after the temp file is removed).
//
// Outputs that are not regular files (docs/errors.md, "Outputs"): the
// rename is applied only to a regular file or a new one. A character device
// or a FIFO (`--json /dev/stdout`, `/dev/null`, a pipe) is written through,
// in place: no temp file, no fsync; a FIFO must already have a reader (it is
// opened with O_NONBLOCK; without one the call fails at once, step
// OpenOutput, instead of blocking), and a reader that goes away gives EPIPE,
// not SIGPIPE. A directory, a block device or a socket is refused (step
// CheckOutput) and left as it is. A symbolic link is followed, as cp does:
// the file it names is replaced (atomically, in that file's directory), a
// device it names is written through; a dangling link is refused.
//
// Threads: every function is safe to call from any thread; a FileSink
// belongs to the call that made it. The system calls go through FileOps
// (LevelDB's Env, reduced to what this needs), so tests can fail any step.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.h"

namespace tessera {

// Incremental SHA-256 (OpenSSL's libcrypto, EVP). update() any number of
// times, then hex_digest() once: 64 lowercase hex digits. One owner; not
// shared between threads without a lock.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t bytes);
  std::string hex_digest();

 private:
  struct Ctx;
  Ctx* ctx_;
};

// The system calls the atomic write makes. Each returns what the POSIX call
// of the same name returns and sets errno on failure. The default
// implementation (posix_file_ops()) calls the kernel; tests override some.
class FileOps {
 public:
  virtual ~FileOps() = default;
  virtual int open(const char* path, int flags, mode_t mode);
  virtual ssize_t write(int fd, const void* data, size_t bytes);
  virtual int fsync(int fd);
  virtual int close(int fd);
  virtual int rename(const char* from, const char* to);
  virtual int unlink(const char* path);
  // Advisory: start writing back [offset, offset + bytes) (sync_file_range),
  // so the final fsync has less to wait for. Failures are ignored.
  virtual void start_writeback(int fd, uint64_t offset, uint64_t bytes);
};
FileOps& posix_file_ops();

// The steps of the contract above, for errors and tests.
enum class FileStep { CreateTemp, Write, SyncFile, CloseFile, Rename, OpenDir, SyncDir, CheckOutput, OpenOutput };
const char* file_step_name(FileStep step);  // "create the temp file", "write", ...

class IoError : public Error {
 public:
  IoError(const std::string& what, std::string path, FileStep step, int os_error)
      : Error(what), path_(std::move(path)), step_(step), os_error_(os_error) {}
  const std::string& path() const { return path_; }  // the destination
  FileStep step() const { return step_; }
  int os_error() const { return os_error_; }  // errno of the failed call

 private:
  std::string path_;
  FileStep step_;
  int os_error_;
};

struct AtomicWriteOptions {
  mode_t mode = 0666;      // of the new file, before the umask
  FileOps* ops = nullptr;  // nullptr: posix_file_ops()
  // false skips steps 3's fsync and 5: still atomic (readers see the old or
  // the new file), not durable across a crash. Only for files whose life is
  // the running job's (FileStore keys: 128 ranks rendezvousing on ext4 spent
  // most of their time in fsync).
  bool sync = true;
  // When set, receives the SHA-256 (hex) of the bytes written, computed by
  // the sink as they are written (no second read of the file); set only when
  // the call succeeds.
  std::string* sha256_hex = nullptr;
  // Write the bytes with O_DIRECT, past the page cache (for large files that
  // are written once and not read back soon: checkpoints). On these VMs
  // filling new page-cache pages is the dominant cost of writing a file
  // (~0.1-0.6 GB/s, the host backing fresh guest pages), while O_DIRECT
  // writes from the sink's reused, aligned buffers run at the disk's speed.
  // Whole 4 KiB blocks go straight from the caller's buffer when it is
  // 4 KiB-aligned, else through a 1 MiB aligned staging buffer; the tail of
  // the file (< 4 KiB) is written buffered. Falls back to buffered writes
  // where the file system refuses O_DIRECT (tmpfs: EINVAL). Same contract
  // otherwise (the final fsync included).
  bool direct = false;
};

// Handed to a streaming writer: appends to the temp file. write() throws
// IoError (step Write) when the disk refuses; the call then fails as a whole.
class FileSink {
 public:
  void write(const void* data, size_t bytes);
  void write(std::string_view s) { write(s.data(), s.size()); }
  uint64_t bytes_written() const { return written_; }
  const std::string& path() const { return path_; }  // the destination

 private:
  friend void write_file_atomic(const std::string&, const std::function<void(FileSink&)>&, const AtomicWriteOptions&);
  FileSink(FileOps& ops, int fd, const std::string& path, const std::string& tmp, Sha256* hash, bool direct)
      : ops_(ops), fd_(fd), path_(path), tmp_(tmp), hash_(hash), direct_(direct) {}
  [[noreturn]] void fail_write(int err) const;  // IoError, step Write
  ~FileSink();
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;
  void put(const char* p, size_t bytes);         // to the fd, continuing short writes
  void put_direct(const char* p, size_t bytes);  // whole blocks with O_DIRECT (falls back to put)
  void to_buffered();                            // clears O_DIRECT on the fd
  void finish();                                 // the staged tail, before the fsync
  FileOps& ops_;
  int fd_;
  const std::string& path_;
  const std::string& tmp_;  // empty: written through (a device or a FIFO), no temp file
  Sha256* hash_;            // nullptr unless AtomicWriteOptions::sha256_hex is set
  bool direct_;
  char* stage_ = nullptr;  // direct: aligned staging buffer (kStage bytes), staged_ of them used
  size_t staged_ = 0;
  uint64_t written_ = 0;           // bytes given to write()
  uint64_t put_ = 0, kicked_ = 0;  // bytes in the file; offset up to which writeback was started
};

// Writes `bytes` to `path` under the contract above.
void write_file_atomic(const std::string& path, std::string_view bytes, const AtomicWriteOptions& options = {});
// Streaming: `fill` writes the content through the sink (e.g. tensor by
// tensor, without building the file in memory).
void write_file_atomic(const std::string& path, const std::function<void(FileSink&)>& fill,
                       const AtomicWriteOptions& options = {});
// Several files written at once (e.g. the TP ranks' shards of one tensor
// stream), each under the contract above: `fill` gets one sink per path, in
// order, and may interleave writes to them; each sink may be written from
// one other thread at a time if `fill` waits for that thread before it
// returns. Each file is atomic on its own, the set is not: when a later
// step fails, files already renamed stay (callers write into a temp
// directory). `sha256_hex`, when given, receives each file's SHA-256.
void write_files_atomic(const std::vector<std::string>& paths,
                        const std::function<void(const std::vector<FileSink*>&)>& fill,
                        std::vector<std::string>* sha256_hex = nullptr, const AtomicWriteOptions& options = {});

// ---- reading ----------------------------------------------------------------
// Opens `path` read-only for a reader that expects a regular file: opens with
// O_NONBLOCK (so a FIFO or a device never blocks the open), fstats, and
// refuses anything that is not a regular file. Returns the fd (the caller
// closes it) and the file's size. Throws FormatError "<path>: ..." naming the
// problem ("not a regular file (a FIFO)", or the OS error).
int open_regular_file(const std::string& path, uint64_t* size);
// open_regular_file for an input a user names (a data file, ...), its
// messages in the inputs' words: FormatError "<what> '<path>': <problem>",
// e.g. "data file 'x': not a regular file (a FIFO)", "data file 'y': cannot
// open: No such file or directory". read_input_file reads through it.
int open_input_file(const std::string& path, const std::string& what, uint64_t* size);
// The whole file through open_regular_file; FormatError when it is larger than max_bytes.
std::string read_regular_file(const std::string& path, uint64_t max_bytes);

// ---- inputs: one reader of small files (docs/errors.md, "Inputs") -----------
// Every JSON or text input a user names (a model, topology or plan file,
// bench's --topology, train_gpt's --plan) is read by read_input_file: it
// refuses at once, without blocking or reading, anything that is not a
// regular file (/dev/zero, a FIFO, a directory) and a file larger than the
// limit (stat first; then at most limit + 1 bytes are read, for a file that
// grows meanwhile). FormatError "<what> '<path>': <problem>", e.g. "model
// file '/dev/zero': not a regular file (a character device)"; a missing
// file is InvalidArgument "<what> '<path>': no such file".
// The limit: far above any real input (a plan for 65,536 ranks is ~5 MB, a
// model or topology a few hundred bytes), far below what would hurt a host.
constexpr uint64_t kMaxInputFileBytes = uint64_t{64} << 20;
std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes = kMaxInputFileBytes);
// Whether an argument that is a preset name or a file path (--model,
// --topology) names a file: it has a slash, ends in ".json", or something of
// any type is there (a FIFO or a device named without a slash is a file, which
// read_input_file then refuses, not an unknown preset).
bool names_input_file(const std::string& arg);
// SHA-256 of the file's bytes as 64 lowercase hex digits (OpenSSL's libcrypto);
// the file must be regular (open_regular_file).
std::string sha256_file_hex(const std::string& path);
// SHA-256 of `bytes` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view bytes);

// ---- temporary files ---------------------------------------------------------
// Every temporary file or directory tessera makes names its creator's pid
// right after a fixed prefix, so a later run can tell what a dead process
// left from what a live one is writing (docs/errors.md, "Temporary files"):
//   write_file_atomic                  DIR/.NAME.tmp.<pid>.XXXXXX
//   ckpt shard / reshard / consolidate OUT's parent/.OUT.tmp-<pid>
//                                      (consolidate to one file: write_file_atomic's temp)
//   bench store directories            $TMPDIR/tessera-bench-<pid>[-<job id>]-XXXXXX (flocked: make_owned_temp_dir)
// Shared memory is memfd (runtime/shm_memory.h): it has no name and goes
// with the last process that maps it.

// $TMPDIR when set and not empty, else /tmp (what std::filesystem's
// temp_directory_path gives, without its exception).
std::string temp_directory();
// Whether process `pid` exists in this PID namespace (kill(pid, 0); EPERM,
// another user's process, counts as alive). A zombie counts as alive.
bool process_alive(pid_t pid);
// The pid that `name` carries after `prefix` ("<prefix><digits>" followed by
// the end of the name, '.' or '-'), or 0 when `name` is not of that form.
pid_t temp_owner(std::string_view name, std::string_view prefix);
// Creates a directory from `tmpl` (its last six characters XXXXXX, as
// mkdtemp) and keeps a shared flock on it until this process exits, so that
// remove_stale_temps run in another PID namespace sharing the directory
// (where this pid may look dead, or belong to nobody) leaves it alone.
// Returns the path; throws Error naming it on failure.
std::string make_owned_temp_dir(std::string tmpl);
// Removes the entries of `dir` named `prefix` + <pid> + ... whose pid is not
// alive: files, or directories with their contents. Never removes one whose
// pid is alive or is this process, nor a regular file or a directory whose
// flock another process holds (a writer in another PID namespace sharing the
// directory; make_owned_temp_dir), nor an entry owned by another user. Returns the paths removed; errors (a
// missing directory, a race with another cleaner) are ignored.
std::vector<std::string> remove_stale_temps(const std::string& dir, std::string_view prefix);
// The pid in the name of a temporary that tessera's writers make next to an
// output, whatever the output is called: ".NAME.tmp.<pid>.XXXXXX"
// (write_file_atomic) or ".NAME.tmp-<pid>" (a ckpt command's output
// directory); 0 for any other name.
pid_t output_temp_owner(std::string_view name);
// Removes from `dir` every temporary of those two forms whose pid is dead,
// whichever output it was for (a killed `ckpt shard --out a` leaves
// .a.tmp-PID; the next run writing b there removes it), under
// remove_stale_temps's rules: never a live pid's, a locked one or another
// user's. Every writer calls it for the directory it writes in:
// write_file_atomic (durable writes), OutputStream, the ckpt commands.
std::vector<std::string> remove_dead_output_temps(const std::string& dir);

// ---- directory commits (checkpoint directories) ------------------------------
// The tree's one directory commit; every rename of a file or directory goes
// through write_file_atomic or these, through FileOps (fault injection).
// commit_directory(tmp, target): the caller has filled the directory `tmp`
// (a sibling of `target`); then
//  1. fsync of every regular file directly in `tmp` (skipped when
//     files_synced: the caller fsynced each as it wrote it), then of `tmp`;
//  2. when `target` exists: an empty directory is removed; anything else is
//     renamed to `aside` (must be given, else InvalidArgument: nothing is
//     replaced silently), which the caller removes once the new one is in use;
//  3. rename(tmp, target);
//  4. fsync of target's parent directory, so the rename survives a crash.
// A crash leaves tmp, or target complete (with `aside` holding the old one).
// IoError naming the target, the step and the OS error.
struct CommitOptions {
  FileOps* ops = nullptr;  // nullptr: posix_file_ops()
  bool files_synced = false;
  std::string aside;  // where an existing non-empty target goes; empty: refuse to replace one
};
void commit_directory(const std::string& tmp, const std::string& target, const CommitOptions& options = {});
// fsync of a directory through `ops` (nullptr: posix); IoError (step OpenDir / SyncDir) naming it.
void fsync_directory(const std::string& dir, FileOps* ops = nullptr);
// fsync of a file through `ops`; IoError (step SyncFile) naming it.
void fsync_path(const std::string& path, FileOps* ops = nullptr);
// ---- outputs: what a path names before tessera writes it -------------------
// (docs/errors.md, "Outputs"; the rule write_file_atomic and OutputStream apply.)
enum class OutputKind {
  New,           // nothing there yet (or a symlink's target does not exist yet: see below)
  Regular,       // a regular file: replaced atomically (write_file_atomic) or truncated (OutputStream)
  WriteThrough,  // a character device or a FIFO: written in place
  Refused,       // a directory, block device, socket or dangling symlink: never written
};
struct OutputTarget {
  OutputKind kind = OutputKind::New;
  std::string path;  // the file to write: `path` itself, or the file a symlink names
  std::string what;  // for messages: "a FIFO", "a directory", ...
};
// stat()s `path` (following symbolic links). Errors other than ENOENT (no
// permission on a directory) give New: the write that follows reports them.
OutputTarget classify_output(const std::string& path);
// For the front-ends' start-up checks (launcher/cli.h check_output_file):
// empty when `path` may be written, else why not ("it is a block device ...").
std::string output_refusal(const std::string& path);
// For the same checks of a directory files will be created in (as
// write_file_atomic creates its temp file): creates and removes a probe
// file there; empty when that worked, else why not (access() says yes to
// root in /proc or on a read-only mount's directory).
std::string file_creation_refusal(const std::string& dir);

// An output written as it goes (a step log, one line at a time), under the
// same rule: a regular file (new or existing) is truncated and written in
// place, a character device or a FIFO written through, anything else
// refused. Every write is checked: write() throws IoError (step Write)
// naming the path and the OS error (ENOSPC on a full disk, EPIPE when a
// FIFO's reader went away), and close() reports a failed fsync or close.
// The system calls go through FileOps (fault injection), as the atomic write's do.
// One owner; not shared between threads without a lock.
struct OutputStreamOptions {
  bool append = false;     // a regular file: appended to (O_APPEND), not truncated (`tessera run`'s rank logs)
  FileOps* ops = nullptr;  // nullptr: posix_file_ops()
};
class OutputStream {
 public:
  explicit OutputStream(const std::string& path,
                        const OutputStreamOptions& options = {});  // IoError: CheckOutput, OpenOutput
  ~OutputStream();                                                 // closes; errors are lost: call close()
  OutputStream(const OutputStream&) = delete;
  OutputStream& operator=(const OutputStream&) = delete;
  void write(std::string_view bytes);
  void close();  // fsync (regular files) and close; IoError on failure
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  FileOps* ops_;
  int fd_ = -1;
  bool regular_ = false;
};

}  // namespace tessera
