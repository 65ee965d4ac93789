#include "runtime/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

namespace tessera {

int FileOps::open(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }
ssize_t FileOps::write(int fd, const void* data, size_t bytes) { return ::write(fd, data, bytes); }
int FileOps::fsync(int fd) { return ::fsync(fd); }
int FileOps::close(int fd) { return ::close(fd); }
int FileOps::rename(const char* from, const char* to) { return ::rename(from, to); }
int FileOps::unlink(const char* path) { return ::unlink(path); }
void FileOps::start_writeback(int fd, uint64_t offset, uint64_t bytes) {
  ::sync_file_range(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes), SYNC_FILE_RANGE_WRITE);
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
  }
  return "?";
}

namespace {

[[noreturn]] void fail(const std::string& path, FileStep step, const std::string& object, int err) {
  throw IoError(detail::concat(path, ": cannot ", file_step_name(step), " ", object, ": ", std::strerror(err)), path,
                step, err);
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

void FileSink::write(const void* data, size_t bytes) {
  // Start writeback of every completed 32 MiB so the disk works while the
  // caller produces the rest, and the final fsync has little left to wait for.
  constexpr uint64_t kChunk = uint64_t{32} << 20;
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // Linux caps one write at ~2 GiB; larger buffers go in pieces.
    const ssize_t n = ops_.write(fd_, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path_, FileStep::Write, tmp_, errno);
    if (n == 0) fail(path_, FileStep::Write, tmp_, EIO);  // no progress: would loop forever
    p += n;
    bytes -= static_cast<size_t>(n);
    written_ += static_cast<uint64_t>(n);
    if (written_ - kicked_ >= kChunk) {
      ops_.start_writeback(fd_, kicked_, written_ - kicked_);
      kicked_ = written_;
    }
  }
}

void write_file_atomic(const std::string& path, const std::function<void(FileSink&)>& fill,
                       const AtomicWriteOptions& options) {
  FileOps& ops = options.ops ? *options.ops : posix_file_ops();
  const size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  TESSERA_ARG_CHECK(!name.empty() && name != "." && name != "..", "cannot write '", path, "': not a file name");
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  // The temp name stays within NAME_MAX however long the destination's name.
  const std::string stem =
      (slash == std::string::npos ? "" : path.substr(0, slash + 1)) + "." + name.substr(0, 200) + ".tmp.";

  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = stem + random_suffix();
    fd = ops.open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, options.mode);
    if (fd < 0 && (errno != EEXIST || attempt >= 100)) fail(path, FileStep::CreateTemp, tmp, errno);
  }
  try {
    FileSink sink(ops, fd, path, tmp);
    fill(sink);
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

void write_file_atomic(const std::string& path, std::string_view bytes, const AtomicWriteOptions& options) {
  write_file_atomic(
      path, [bytes](FileSink& out) { out.write(bytes.data(), bytes.size()); }, options);
}

}  // namespace tessera
