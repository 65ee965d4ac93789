#include "runtime/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

namespace tessera {

int FileOps::open(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }
namespace {

// A pipe for FileOps::write's splice path, one per thread, empty between calls.
class SplicePipe {
 public:
  ~SplicePipe() { close_fds(); }
  // False once splicing failed in a way a retry would not fix (then plain write()).
  bool usable() {
    if (r_ < 0 && !disabled_) {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) {
        disabled_ = true;
      } else {
        r_ = p[0];
        w_ = p[1];
        const int got = ::fcntl(w_, F_SETPIPE_SZ, 1 << 20);
        size_ = got > 0 ? static_cast<size_t>(got) : size_t{64} << 10;
      }
    }
    return r_ >= 0;
  }
  void disable() {
    close_fds();
    disabled_ = true;
  }
  void reset() { close_fds(); }  // drops whatever the pipe still holds
  int r() const { return r_; }
  int w() const { return w_; }
  size_t size() const { return size_; }

 private:
  void close_fds() {
    if (r_ >= 0) ::close(r_);
    if (w_ >= 0) ::close(w_);
    r_ = w_ = -1;
  }
  int r_ = -1, w_ = -1;
  size_t size_ = 0;
  bool disabled_ = false;
};

}  // namespace

// User bytes go to the file through a pipe (vmsplice, then splice), not
// write(2): on this project's VMs (Linux 6.18, ext4) write(2) of a buffer
// into new page-cache pages of a file costs ~5 s of kernel time per GiB
// (copy_folio_from_iter_atomic), while the same bytes spliced from a pipe
// cost ~0.3 s, as `cp` (copy_file_range) does; measured with a 2 GiB file
// (docs/checkpoint.md). The pipe is drained before returning, so the
// caller may reuse its buffer at once. Where splicing is refused (EINVAL:
// a file system without splice_write) the plain write(2) is used. Each
// thread that writes 64 KiB or more at once keeps one pipe (two fds).
ssize_t FileOps::write(int fd, const void* data, size_t bytes) {
  // Small writes (manifests, store keys) go straight to write(2), so threads
  // that never write large files hold no pipe.
  if (bytes < (size_t{64} << 10)) return ::write(fd, data, bytes);
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0 && (fl & O_DIRECT) != 0) return ::write(fd, data, bytes);  // no page cache to splice into
  thread_local SplicePipe pipe;
  if (!pipe.usable()) return ::write(fd, data, bytes);
  iovec iov{const_cast<void*>(data), std::min(bytes, pipe.size())};
  ssize_t n;
  do {
    n = ::vmsplice(pipe.w(), &iov, 1, 0);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {
    pipe.disable();
    return ::write(fd, data, bytes);
  }
  ssize_t done = 0;
  while (done < n) {
    const ssize_t k = ::splice(pipe.r(), nullptr, fd, nullptr, static_cast<size_t>(n - done), SPLICE_F_MOVE);
    if (k < 0 && errno == EINTR) continue;
    if (k > 0) {
      done += k;
      continue;
    }
    const int err = k == 0 ? EIO : errno;
    if (done > 0) {  // a short write: the caller continues from here
      pipe.reset();
      return done;
    }
    if (err == EINVAL || err == ENOSYS || err == EOPNOTSUPP) {  // no splice to this file: write(2) from now on
      pipe.disable();
      return ::write(fd, data, bytes);
    }
    pipe.reset();
    errno = err;
    return -1;
  }
  return done;
}
int FileOps::fsync(int fd) { return ::fsync(fd); }
int FileOps::close(int fd) { return ::close(fd); }
int FileOps::rename(const char* from, const char* to) { return ::rename(from, to); }
int FileOps::unlink(const char* path) { return ::unlink(path); }
void FileOps::start_writeback(int fd, uint64_t offset, uint64_t bytes) {
  ::sync_file_range(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes), SYNC_FILE_RANGE_WRITE);
}

struct Sha256::Ctx {
  EVP_MD_CTX* md;
};

Sha256::Sha256() : ctx_(new Ctx{EVP_MD_CTX_new()}) {
  if (!ctx_->md || EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_->md);
    delete ctx_;
    throw Error("SHA-256: cannot initialise libcrypto");
  }
}
Sha256::~Sha256() {
  EVP_MD_CTX_free(ctx_->md);
  delete ctx_;
}
void Sha256::update(const void* p, size_t n) {
  if (n && EVP_DigestUpdate(ctx_->md, p, n) != 1) throw Error("SHA-256: update failed");
}

FileOps& posix_file_ops() {
  static FileOps ops;
  return ops;
}

const char* file_step_name(FileStep step) {
  switch (step) {
    case FileStep::CreateTemp:
      return "create the temp file";
    case FileStep::Write:
      return "write the temp file";
    case FileStep::SyncFile:
      return "fsync the temp file";
    case FileStep::CloseFile:
      return "close the temp file";
    case FileStep::Rename:
      return "rename the temp file over the destination";
    case FileStep::OpenDir:
      return "open the directory";
    case FileStep::SyncDir:
      return "fsync the directory";
    case FileStep::CheckOutput:
      return "check the output";
    case FileStep::OpenOutput:
      return "open the output";
  }
  return "?";
}

namespace {

[[noreturn]] void fail(const std::string& path, FileStep step, const std::string& object, int err) {
  throw IoError(detail::concat(path, ": cannot ", file_step_name(step), " ", object, ": ", std::strerror(err)), path,
                step, err);
}

// The directory `path` is in: "." for a bare name, "/" for "/name".
std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// Six characters from [A-Za-z0-9], from a generator reseeded in every
// process (a forked child must not repeat its parent's names; O_EXCL would
// catch it, at the cost of a retry).
std::string random_suffix() {
  static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 gen;
  thread_local pid_t seeded_for = 0;
  if (seeded_for != ::getpid()) {
    std::random_device rd;
    gen.seed((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid()));
    seeded_for = ::getpid();
  }
  std::string s(6, 'x');
  for (char& c : s) c = kChars[gen() % (sizeof kChars - 1)];
  return s;
}

}  // namespace

namespace {
constexpr size_t kDirectAlign = 4096;  // O_DIRECT: buffer, offset and length in whole blocks
constexpr size_t kDirectStage = size_t{1} << 20;
bool block_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kDirectAlign == 0; }
}  // namespace

FileSink::~FileSink() { std::free(stage_); }

void FileSink::fail_write(int err) const {
  if (!tmp_.empty()) fail(path_, FileStep::Write, tmp_, err);
  throw IoError(detail::concat(path_, ": cannot write: ", std::strerror(err)), path_, FileStep::Write, err);
}

void FileSink::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  if (hash_) hash_->update(p, bytes);
  written_ += bytes;
  if (!direct_) {
    put(p, bytes);
    return;
  }
  while (bytes > 0) {
    if (staged_ == 0 && block_aligned(p) && bytes >= kDirectAlign) {
      const size_t k = bytes & ~(kDirectAlign - 1);  // whole blocks straight from the caller's buffer
      put_direct(p, k);
      p += k;
      bytes -= k;
      continue;
    }
    if (!stage_) {
      stage_ = static_cast<char*>(std::aligned_alloc(kDirectAlign, kDirectStage));
      if (!stage_) throw std::bad_alloc();
    }
    const size_t k = std::min(bytes, kDirectStage - staged_);
    std::memcpy(stage_ + staged_, p, k);
    staged_ += k;
    p += k;
    bytes -= k;
    if (staged_ == kDirectStage) {
      staged_ = 0;
      put_direct(stage_, kDirectStage);
    }
    if (!direct_ && staged_ > 0) {  // O_DIRECT was refused meanwhile: the rest goes buffered
      const size_t n = staged_;
      staged_ = 0;
      put(stage_, n);
    }
  }
}

void FileSink::put(const char* p, size_t bytes) {
  // Start writeback of every completed 32 MiB so the disk works while the
  // caller produces the rest, and the final fsync has little left to wait for.
  constexpr uint64_t kChunk = uint64_t{32} << 20;
  while (bytes > 0) {
    // Linux caps one write at ~2 GiB; larger buffers go in pieces.
    const ssize_t n = ops_.write(fd_, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_write(errno);
    if (n == 0) fail_write(EIO);  // no progress: would loop forever
    p += n;
    bytes -= static_cast<size_t>(n);
    put_ += static_cast<uint64_t>(n);
    if (put_ - kicked_ >= kChunk) {
      ops_.start_writeback(fd_, kicked_, put_ - kicked_);
      kicked_ = put_;
    }
  }
}

void FileSink::to_buffered() {
  const int fl = ::fcntl(fd_, F_GETFL);
  if (fl >= 0) ::fcntl(fd_, F_SETFL, fl & ~O_DIRECT);
  direct_ = false;
}

void FileSink::put_direct(const char* p, size_t bytes) {
  while (bytes > 0 && direct_) {
    const ssize_t n = ops_.write(fd_, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL) {  // the file system wants another alignment, or no O_DIRECT at all
      to_buffered();
      break;
    }
    if (n < 0) fail_write(errno);
    if (n == 0) fail_write(EIO);
    p += n;
    bytes -= static_cast<size_t>(n);
    put_ += static_cast<uint64_t>(n);
    kicked_ = put_;                                                 // O_DIRECT: already sent to the disk
    if (static_cast<size_t>(n) % kDirectAlign != 0) to_buffered();  // a short write: offsets no longer aligned
  }
  if (bytes > 0) put(p, bytes);
}

void FileSink::finish() {
  if (staged_ == 0) return;
  const size_t whole = direct_ ? staged_ & ~(kDirectAlign - 1) : 0;
  if (whole > 0) put_direct(stage_, whole);
  if (staged_ > whole) {
    if (direct_) to_buffered();  // the last partial block
    put(stage_ + whole, staged_ - whole);
  }
  staged_ = 0;
}

namespace {

// SIGPIPE held back while writing through to a FIFO, so a reader that went
// away is an EPIPE error naming the output instead of the process's death.
// A SIGPIPE raised meanwhile (by this thread's writes) is consumed.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    ::sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    blocked_ = ::pthread_sigmask(SIG_BLOCK, &pipe_set, &old_) == 0;
  }
  ~NoSigpipe() {
    if (!blocked_) return;
    if (!was_pending_) {
      sigset_t pipe_set, pending;
      sigemptyset(&pipe_set);
      sigaddset(&pipe_set, SIGPIPE);
      sigemptyset(&pending);
      if (::sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (::sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t old_;
  bool blocked_ = false, was_pending_ = false;
};

// Opens a character device or a FIFO for writing in place: O_NONBLOCK, so
// neither a FIFO without a reader nor a slow device blocks the open (a FIFO
// then fails with ENXIO), and back to blocking writes once open. Re-checks
// what was opened: a regular file that replaced the device meanwhile gives
// -1 with errno EAGAIN (the caller writes it atomically instead).
int open_write_through(FileOps& ops, const std::string& path, const OutputTarget& t) {
  const int fd = ops.open(t.path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENXIO && t.what == "a FIFO")
      throw IoError(detail::concat(path, ": cannot open the FIFO for writing: no process has it open for reading ",
                                   "(start the reader first; tessera does not wait for one)"),
                    path, FileStep::OpenOutput, err);
    throw IoError(detail::concat(path, ": cannot open ", t.what, " for writing: ", std::strerror(err)), path,
                  FileStep::OpenOutput, err);
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && !S_ISCHR(st.st_mode) && !S_ISFIFO(st.st_mode)) {
    ops.close(fd);
    errno = EAGAIN;
    return -1;
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

}  // namespace

void write_file_atomic(const std::string& path, const std::function<void(FileSink&)>& fill,
                       const AtomicWriteOptions& options) {
  FileOps& ops = options.ops ? *options.ops : posix_file_ops();
  const size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  TESSERA_ARG_CHECK(!name.empty() && name != "." && name != "..", "cannot write '", path, "': not a file name");
  const OutputTarget target = classify_output(path);
  if (target.kind == OutputKind::Refused)
    throw IoError(detail::concat(path, ": cannot write: it is ", target.what,
                                 " (tessera writes regular files, character devices and FIFOs; it replaces only "
                                 "regular files)"),
                  path, FileStep::CheckOutput, EEXIST);
  if (target.path != path) {  // a symlink: the file it names, in that file's directory
    write_file_atomic(target.path, fill, options);
    return;
  }
  if (target.kind == OutputKind::WriteThrough) {
    int fd = open_write_through(ops, path, target);
    if (fd >= 0) {
      static const std::string kNoTemp;
      NoSigpipe no_sigpipe;
      try {
        std::unique_ptr<Sha256> hash = options.sha256_hex ? std::make_unique<Sha256>() : nullptr;
        FileSink sink(ops, fd, path, kNoTemp, hash.get(), false);
        fill(sink);
        sink.finish();
        if (hash) *options.sha256_hex = hash->hex_digest();
      } catch (...) {
        ops.close(fd);
        throw;
      }
      if (ops.close(fd) != 0) {
        const int err = errno;
        throw IoError(detail::concat(path, ": cannot close: ", std::strerror(err)), path, FileStep::CloseFile, err);
      }
      return;
    }
    // A regular file replaced the device since the stat: the atomic write below.
  }
  const std::string dir = directory_of(path);
  // The temp name stays within NAME_MAX however long the destination's name.
  const std::string prefix = "." + name.substr(0, 200) + ".tmp.";
  const std::string stem =
      (slash == std::string::npos ? "" : path.substr(0, slash + 1)) + prefix + std::to_string(::getpid()) + ".";
  // Leftovers of writers that died in this directory, of this file or any
  // other. Not for the FileStore's job-lifetime keys (sync off): one
  // directory listing per key would make a large rendezvous quadratic, and
  // its directory is removed as a whole.
  if (options.sync) remove_dead_output_temps(dir);

  std::string tmp;
  int fd = -1;
  bool direct = options.direct;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = stem + random_suffix();
    fd = ops.open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | (direct ? O_DIRECT : 0), options.mode);
    if (fd < 0 && direct && errno == EINVAL) {  // no O_DIRECT here (tmpfs): buffered
      direct = false;
      fd = ops.open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, options.mode);
    }
    if (fd < 0 && (errno != EEXIST || attempt >= 100)) fail(path, FileStep::CreateTemp, tmp, errno);
  }
  // Held while writing: remove_stale_temps leaves a locked temp alone even
  // when its pid means nothing here (a writer in another PID namespace).
  if (!options.ops) ::flock(fd, LOCK_EX | LOCK_NB);
  try {
    std::unique_ptr<Sha256> hash = options.sha256_hex ? std::make_unique<Sha256>() : nullptr;
    FileSink sink(ops, fd, path, tmp, hash.get(), direct);
    fill(sink);
    sink.finish();
    if (hash) *options.sha256_hex = hash->hex_digest();
    if (options.sync && ops.fsync(fd) != 0) fail(path, FileStep::SyncFile, tmp, errno);
    const int closed = ops.close(fd);
    fd = -1;  // closed even when close() reports an error (Linux)
    if (closed != 0) fail(path, FileStep::CloseFile, tmp, errno);
    if (ops.rename(tmp.c_str(), path.c_str()) != 0) fail(path, FileStep::Rename, tmp, errno);
  } catch (...) {
    if (fd >= 0) ops.close(fd);
    ops.unlink(tmp.c_str());
    throw;
  }
  // The rename is done: make it durable. The temp file no longer exists.
  if (!options.sync) return;
  const int dfd = ops.open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (dfd < 0) fail(path, FileStep::OpenDir, dir, errno);
  if (ops.fsync(dfd) != 0) {
    const int err = errno;
    ops.close(dfd);
    fail(path, FileStep::SyncDir, dir, err);
  }
  ops.close(dfd);
}

namespace {

void write_files_from(const std::vector<std::string>& paths, size_t k, std::vector<FileSink*>& sinks,
                      const std::function<void(const std::vector<FileSink*>&)>& fill,
                      std::vector<std::string>* sha256_hex, const AtomicWriteOptions& options) {
  if (k == paths.size()) {
    fill(sinks);
    return;
  }
  AtomicWriteOptions o = options;
  o.sha256_hex = sha256_hex ? &(*sha256_hex)[k] : nullptr;
  write_file_atomic(
      paths[k],
      [&](FileSink& s) {
        sinks[k] = &s;
        write_files_from(paths, k + 1, sinks, fill, sha256_hex, options);
      },
      o);
}

}  // namespace

void write_files_atomic(const std::vector<std::string>& paths,
                        const std::function<void(const std::vector<FileSink*>&)>& fill,
                        std::vector<std::string>* sha256_hex, const AtomicWriteOptions& options) {
  std::vector<FileSink*> sinks(paths.size(), nullptr);
  if (sha256_hex) sha256_hex->assign(paths.size(), std::string());
  write_files_from(paths, 0, sinks, fill, sha256_hex, options);
}

void write_file_atomic(const std::string& path, std::string_view bytes, const AtomicWriteOptions& options) {
  write_file_atomic(
      path, [bytes](FileSink& out) { out.write(bytes.data(), bytes.size()); }, options);
}

// ---- temporary files ---------------------------------------------------------

std::string temp_directory() {
  const char* t = std::getenv("TMPDIR");
  return t && *t ? std::string(t) : std::string("/tmp");
}

bool process_alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

pid_t temp_owner(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return 0;
  size_t i = prefix.size();
  int64_t pid = 0;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && pid <= 0x3fffffff; ++i)
    pid = pid * 10 + (name[i] - '0');
  if (i == prefix.size() || pid <= 0 || pid > 0x3fffffff) return 0;
  if (i < name.size() && name[i] != '.' && name[i] != '-') return 0;
  return static_cast<pid_t>(pid);
}

std::string make_owned_temp_dir(std::string tmpl) {
  if (!::mkdtemp(tmpl.data()))
    throw Error(detail::concat(tmpl, ": cannot create a temporary directory: ", std::strerror(errno)));
  const int fd = ::open(tmpl.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 || ::flock(fd, LOCK_SH) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    ::rmdir(tmpl.c_str());
    throw Error(detail::concat(tmpl, ": cannot lock the temporary directory: ", std::strerror(err)));
  }
  // `fd` stays open (and its lock held) for the life of the process.
  return tmpl;
}

namespace {

// The entries of `dir` that `owner` gives a pid for, when that pid is dead,
// under remove_stale_temps's rules.
template <typename Owner>
std::vector<std::string> remove_dead_entries(const std::string& dir, const Owner& owner) {
  std::vector<std::string> removed;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return removed;
  std::vector<std::string> candidates;
  while (const dirent* e = ::readdir(d)) {
    const pid_t pid = owner(std::string_view(e->d_name));
    if (pid != 0 && pid != ::getpid() && !process_alive(pid)) candidates.emplace_back(e->d_name);
  }
  ::closedir(d);
  for (const std::string& name : candidates) {
    const std::string p = detail::concat(dir, "/", name);
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;
    if (S_ISREG(st.st_mode)) {
      const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
      if (fd < 0) continue;
      const bool locked = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
      if (!locked && ::unlink(p.c_str()) == 0) removed.push_back(p);
      ::close(fd);
    } else if (S_ISDIR(st.st_mode)) {
      const int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0) continue;
      const bool locked = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
      std::error_code ec;
      if (!locked && std::filesystem::remove_all(p, ec) > 0 && !ec) removed.push_back(p);
      ::close(fd);
    } else {
      std::error_code ec;
      if (std::filesystem::remove_all(p, ec) > 0 && !ec) removed.push_back(p);
    }
  }
  return removed;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::vector<std::string> remove_stale_temps(const std::string& dir, std::string_view prefix) {
  return remove_dead_entries(dir, [prefix](std::string_view name) { return temp_owner(name, prefix); });
}

pid_t output_temp_owner(std::string_view name) {
  if (name.size() < 2 || name[0] != '.') return 0;
  // ".NAME.tmp-<pid>": a ckpt command's output directory.
  if (const size_t dash = name.rfind(".tmp-");
      dash != std::string_view::npos && dash > 1 && all_digits(name.substr(dash + 5)))
    return temp_owner(name.substr(dash), ".tmp-");
  // ".NAME.tmp.<pid>.XXXXXX": write_file_atomic's temp file (random_suffix: six of [A-Za-z0-9]).
  constexpr size_t kSuffix = 6;
  if (name.size() < kSuffix + 1 || name[name.size() - kSuffix - 1] != '.') return 0;
  const std::string_view suffix = name.substr(name.size() - kSuffix);
  if (!std::all_of(suffix.begin(), suffix.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); }))
    return 0;
  const std::string_view head = name.substr(0, name.size() - kSuffix - 1);  // ".NAME.tmp.<pid>"
  const size_t dot = head.rfind(".tmp.");
  if (dot == std::string_view::npos || dot <= 1 || !all_digits(head.substr(dot + 5))) return 0;
  return temp_owner(head.substr(dot), ".tmp.");
}

std::vector<std::string> remove_dead_output_temps(const std::string& dir) {
  return remove_dead_entries(dir, output_temp_owner);
}

// ---- reading ----------------------------------------------------------------

namespace {

const char* file_kind(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a plain file";
}

std::string os_msg(const std::string& path, const char* what, int err) {
  return detail::concat(path, ": ", what, ": ", std::strerror(err));
}

struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

template <typename Fn>
void read_all(const std::string& path, int fd, Fn on_bytes) {
  std::vector<char> buf(size_t{1} << 20);
  for (;;) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      throw FormatError(os_msg(path, "cannot read", errno));
    }
    if (r == 0) return;
    on_bytes(buf.data(), static_cast<size_t>(r));
  }
}

std::string hex(const unsigned char* d, unsigned n) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < n; ++i) {
    s += k[d[i] >> 4];
    s += k[d[i] & 15];
  }
  return s;
}

}  // namespace

std::string Sha256::hex_digest() {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  if (EVP_DigestFinal_ex(ctx_->md, d, &n) != 1) throw Error("SHA-256: final failed");
  return hex(d, n);
}

int open_regular_file(const std::string& path, uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw FormatError(os_msg(path, "cannot open", errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw FormatError(os_msg(path, "cannot stat", e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw FormatError(detail::concat(path, ": not a regular file (", file_kind(st.st_mode), ")"));
  }
  // Back to blocking reads (a regular file never blocks, but be plain).
  int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  if (size) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  FdCloser fd{open_regular_file(path, &size)};
  if (size > max_bytes)
    throw FormatError(detail::concat(path, ": ", size, " bytes, more than the limit of ", max_bytes));
  std::string out;
  out.reserve(size);
  // At most max_bytes + 1 bytes are read: one past the limit proves the file grew past it.
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(max_bytes + 1, uint64_t{1} << 20)));
  for (;;) {
    const uint64_t room = max_bytes + 1 - out.size();
    const ssize_t r = ::read(fd.fd, buf.data(), static_cast<size_t>(std::min<uint64_t>(buf.size(), room)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw FormatError(os_msg(path, "cannot read", errno));
    if (r == 0) return out;
    if (out.size() + static_cast<size_t>(r) > max_bytes)
      throw FormatError(detail::concat(path, ": grew past the limit of ", max_bytes, " bytes while read"));
    out.append(buf.data(), static_cast<size_t>(r));
  }
}

bool names_input_file(const std::string& arg) {
  constexpr std::string_view kJson = ".json";
  if (arg.find('/') != std::string::npos) return true;
  if (arg.size() > kJson.size() && arg.compare(arg.size() - kJson.size(), kJson.size(), kJson) == 0) return true;
  struct stat st {};
  return ::lstat(arg.c_str(), &st) == 0;
}

namespace {
// The reader's messages start with the path; say what the file is for instead.
[[noreturn]] void rethrow_as_input(const FormatError& e, const std::string& path, const std::string& what) {
  std::string m = e.what();
  if (m.compare(0, path.size() + 2, path + ": ") == 0) m.erase(0, path.size() + 2);
  throw FormatError(detail::concat(what, " '", path, "': ", m));
}
}  // namespace

int open_input_file(const std::string& path, const std::string& what, uint64_t* size) {
  try {
    return open_regular_file(path, size);
  } catch (const FormatError& e) {
    rethrow_as_input(e, path, what);
  }
}

std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  // A missing file is the caller's bad argument (InvalidArgument, as before); the rest FormatError.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT)
    throw InvalidArgument(detail::concat(what, " '", path, "': no such file"));
  try {
    return read_regular_file(path, max_bytes);
  } catch (const FormatError& e) {
    rethrow_as_input(e, path, what);
  }
}

std::string sha256_file_hex(const std::string& path) {
  FdCloser fd{open_regular_file(path, nullptr)};
  Sha256 h;
  read_all(path, fd.fd, [&](const char* p, size_t n) { h.update(p, n); });
  return h.hex_digest();
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes.data(), bytes.size());
  return h.hex_digest();
}

// ---- directory commits (checkpoint directories) ------------------------------

void fsync_directory(const std::string& dir, FileOps* ops_in) {
  FileOps& ops = ops_in ? *ops_in : posix_file_ops();
  const int fd = ops.open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd < 0) fail(dir, FileStep::OpenDir, dir, errno);
  if (ops.fsync(fd) != 0) {
    const int err = errno;
    ops.close(fd);
    fail(dir, FileStep::SyncDir, dir, err);
  }
  ops.close(fd);
}

void fsync_path(const std::string& path, FileOps* ops_in) {
  FileOps& ops = ops_in ? *ops_in : posix_file_ops();
  const int fd = ops.open(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) fail(path, FileStep::SyncFile, path, errno);
  if (ops.fsync(fd) != 0) {
    const int err = errno;
    ops.close(fd);
    fail(path, FileStep::SyncFile, path, err);
  }
  ops.close(fd);
}

void commit_directory(const std::string& tmp, const std::string& target, const CommitOptions& o) {
  FileOps& ops = o.ops ? *o.ops : posix_file_ops();
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!o.files_synced) {
    for (const auto& e : fs::directory_iterator(tmp, ec))
      if (e.is_regular_file(ec)) fsync_path(e.path().string(), &ops);
    if (ec) fail(target, FileStep::OpenDir, tmp, ec.value());
  }
  fsync_directory(tmp, &ops);
  const fs::path t = fs::path(target).lexically_normal();
  const std::string parent = t.has_parent_path() ? t.parent_path().string() : ".";
  if (fs::symlink_status(t, ec).type() != fs::file_type::not_found) {
    // rename(2) replaces an empty directory by itself; anything else moves aside first (or is refused).
    if (!(fs::is_directory(fs::symlink_status(t, ec)) && fs::is_empty(t, ec))) {
      TESSERA_ARG_CHECK(!o.aside.empty(), target, " exists and is not an empty directory (not replaced)");
      fs::remove_all(o.aside, ec);
      if (ops.rename(target.c_str(), o.aside.c_str()) != 0) fail(target, FileStep::Rename, o.aside, errno);
    }
  }
  if (ops.rename(tmp.c_str(), target.c_str()) != 0) fail(target, FileStep::Rename, tmp, errno);
  fsync_directory(parent, &ops);
}

// ---- outputs: what a path names before tessera writes it -------------------

namespace {
const char* refused_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return nullptr;
}
}  // namespace

OutputTarget classify_output(const std::string& path) {
  OutputTarget t;
  t.path = path;
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) != 0) return t;  // New (or an error the write reports)
  struct stat st = lst;
  if (S_ISLNK(lst.st_mode)) {
    if (::stat(path.c_str(), &st) != 0) {
      t.kind = OutputKind::Refused;
      t.what = detail::concat("a symbolic link to a missing file (", std::strerror(errno), ")");
      return t;
    }
    if (S_ISREG(st.st_mode)) {
      // Replace the file the link names, not the link (as cp does).
      char* real = ::realpath(path.c_str(), nullptr);
      if (!real) {
        t.kind = OutputKind::Refused;
        t.what = detail::concat("a symbolic link that cannot be resolved (", std::strerror(errno), ")");
        return t;
      }
      t.path = real;
      std::free(real);
    }
  }
  if (S_ISREG(st.st_mode)) {
    t.kind = OutputKind::Regular;
    t.what = "a regular file";
  } else if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
    t.kind = OutputKind::WriteThrough;
    t.what = S_ISFIFO(st.st_mode) ? "a FIFO" : "a character device";
  } else {
    const char* k = refused_kind(st.st_mode);
    t.kind = OutputKind::Refused;
    t.what = k ? k : "not a regular file";
  }
  return t;
}

std::string file_creation_refusal(const std::string& dir) {
  const std::string probe =
      (std::filesystem::path(dir.empty() ? "." : dir) / (".tessera-probe." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return detail::concat("cannot create a file in '", dir, "': ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return {};
}

std::string output_refusal(const std::string& path) {
  const OutputTarget t = classify_output(path);
  if (t.kind != OutputKind::Refused) return {};
  return detail::concat("it is ", t.what, " (tessera writes regular files, character devices and FIFOs)");
}

OutputStream::OutputStream(const std::string& path, const OutputStreamOptions& options)
    : path_(path), ops_(options.ops ? options.ops : &posix_file_ops()) {
  const OutputTarget t = classify_output(path);
  if (t.kind == OutputKind::Refused)
    throw IoError(detail::concat(path, ": cannot write: it is ", t.what,
                                 " (tessera writes regular files, character devices and FIFOs)"),
                  path, FileStep::CheckOutput, EEXIST);
  if (t.kind == OutputKind::WriteThrough) {
    fd_ = open_write_through(*ops_, path, t);
    if (fd_ >= 0) return;
  }
  remove_dead_output_temps(directory_of(t.path));  // what killed writers left next to it
  const int mode = options.append ? O_APPEND : O_TRUNC;
  fd_ = ops_->open(t.path.c_str(), O_WRONLY | O_CREAT | mode | O_CLOEXEC | O_NOCTTY, 0666);
  if (fd_ < 0) {
    const int err = errno;
    throw IoError(detail::concat(path, ": cannot open for writing: ", std::strerror(err)), path, FileStep::OpenOutput,
                  err);
  }
  regular_ = true;
}

OutputStream::~OutputStream() {
  if (fd_ >= 0) ops_->close(fd_);
}

void OutputStream::write(std::string_view bytes) {
  TESSERA_CHECK(fd_ >= 0, "OutputStream::write after close");
  NoSigpipe no_sigpipe;
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ops_->write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      throw IoError(detail::concat(path_, ": cannot write: ", std::strerror(err)), path_, FileStep::Write, err);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void OutputStream::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (regular_ && ops_->fsync(fd) != 0) {
    const int err = errno;
    ops_->close(fd);
    throw IoError(detail::concat(path_, ": cannot fsync: ", std::strerror(err)), path_, FileStep::SyncFile, err);
  }
  if (ops_->close(fd) != 0) {
    const int err = errno;
    throw IoError(detail::concat(path_, ": cannot close: ", std::strerror(err)), path_, FileStep::CloseFile, err);
  }
}

}  // namespace tessera
