// write_file_atomic (runtime/files.h): the order of the system calls, a
// failure injected at every step (as LevelDB's fault-injection Env does),
// and concurrent writers of one path.
#include "runtime/files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace tessera {
namespace {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tessera_files_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string path_;
};

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void put(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
  ASSERT_TRUE(f.good()) << path;
}

// 200 KB that no prefix of another content equals.
std::string content(char tag, size_t n = 200'000) {
  std::string s(n, tag);
  for (size_t i = 0; i < n; i += 997) s[i] = static_cast<char>('a' + (i / 997) % 26);
  return s;
}

// The faults a test can ask for. ShortWrite: the first write stores half of
// what it was given (a real partial write) and the next one fails with ENOSPC.
enum class Fault { None, CreateTemp, Write, ShortWrite, SyncFile, CloseFile, Rename, OpenDir, SyncDir };

// Real system calls, recorded as a trace, with one call failing on request.
class FaultyOps : public FileOps {
 public:
  explicit FaultyOps(Fault fault, int err = EIO) : fault_(fault), err_(err) {}

  int open(const char* path, int flags, mode_t mode) override {
    const bool dir = (flags & O_DIRECTORY) != 0;
    trace.push_back(dir ? "open dir" : "open temp");
    if (fire(dir ? Fault::OpenDir : Fault::CreateTemp)) return -1;
    const int fd = FileOps::open(path, flags, mode);
    if (fd >= 0) (dir ? dir_fds_ : temp_fds_).insert(fd);
    if (!dir) temp_path = path;
    return fd;
  }
  ssize_t write(int fd, const void* data, size_t bytes) override {
    trace.push_back("write");
    if (fire(Fault::Write)) return -1;
    if (fault_ == Fault::ShortWrite && !fired_) {
      fired_ = true;
      short_pending_ = true;
      return FileOps::write(fd, data, bytes / 2);
    }
    if (short_pending_) {
      errno = ENOSPC;
      return -1;
    }
    return FileOps::write(fd, data, bytes);
  }
  int fsync(int fd) override {
    const bool dir = dir_fds_.count(fd) != 0;
    trace.push_back(dir ? "fsync dir" : "fsync temp");
    if (fire(dir ? Fault::SyncDir : Fault::SyncFile)) return -1;
    return FileOps::fsync(fd);
  }
  int close(int fd) override {
    const bool dir = dir_fds_.count(fd) != 0;
    trace.push_back(dir ? "close dir" : "close temp");
    if (dir)
      dir_fds_.erase(fd);
    else
      temp_fds_.erase(fd);
    if (!dir && fault_ == Fault::CloseFile && !fired_) {
      FileOps::close(fd);  // Linux frees the descriptor even when close fails
      fired_ = true;
      errno = err_;
      return -1;
    }
    return FileOps::close(fd);
  }
  int rename(const char* from, const char* to) override {
    trace.push_back("rename");
    if (fire(Fault::Rename)) return -1;
    return FileOps::rename(from, to);
  }
  int unlink(const char* path) override {
    trace.push_back("unlink");
    return FileOps::unlink(path);
  }
  void start_writeback(int, uint64_t, uint64_t) override { trace.push_back("writeback"); }

  size_t open_fds() const { return temp_fds_.size() + dir_fds_.size(); }
  std::vector<std::string> trace;
  std::string temp_path;

 private:
  bool fire(Fault f) {
    if (fault_ != f || fired_) return false;
    fired_ = true;
    errno = err_;
    return true;
  }
  Fault fault_;
  int err_;
  bool fired_ = false, short_pending_ = false;
  std::set<int> temp_fds_, dir_fds_;
};

TEST(WriteFileAtomic, MakesTheCallsOfTheContractInOrder) {
  TempDir d;
  const std::string path = d.file("plan.json");
  FaultyOps ops(Fault::None);
  AtomicWriteOptions o;
  o.ops = &ops;
  write_file_atomic(path, content('n'), o);
  EXPECT_EQ(read_file(path), content('n'));
  // The temp file was in the same directory, hidden, and named after the target.
  // ".plan.json.tmp.<pid>.XXXXXX": the creator's pid, for remove_stale_temps.
  const std::string stem = d.file(".plan.json.tmp." + std::to_string(::getpid()) + ".");
  EXPECT_EQ(ops.temp_path.rfind(stem, 0), 0u) << ops.temp_path;
  EXPECT_EQ(ops.temp_path.size(), stem.size() + 6) << ops.temp_path;
  const std::vector<std::string> want = {"open temp", "write",    "fsync temp", "close temp",
                                         "rename",    "open dir", "fsync dir",  "close dir"};
  EXPECT_EQ(ops.trace, want);
  EXPECT_EQ(ops.open_fds(), 0u);
  EXPECT_EQ(d.entries(), std::vector<std::string>{"plan.json"});
}

struct StepCase {
  Fault fault;
  FileStep step;         // the step the error must name
  bool renamed;          // the failure comes after the rename
  const char* os_error;  // strerror text in the message
};

std::string step_case_name(const ::testing::TestParamInfo<StepCase>& info) {
  static const char* kNames[] = {"None",      "CreateTemp", "Write",   "ShortWrite", "SyncFile",
                                 "CloseFile", "Rename",     "OpenDir", "SyncDir"};
  return kNames[static_cast<int>(info.param.fault)];
}

class WriteFileAtomicFault : public ::testing::TestWithParam<StepCase> {};

// For every step: the error names the path, the step and the OS error; the
// destination is the old file (or absent) before the rename and the new one
// after it, never a partial file; no temp file and no descriptor is left.
TEST_P(WriteFileAtomicFault, DestinationIsOldOrNewAndNoTempIsLeft) {
  const StepCase c = GetParam();
  for (bool had_old : {true, false}) {
    TempDir d;
    const std::string path = d.file("model.safetensors");
    if (had_old) put(path, content('o'));
    FaultyOps ops(c.fault, c.fault == Fault::CreateTemp ? EACCES : c.fault == Fault::Write ? ENOSPC : EIO);
    AtomicWriteOptions o;
    o.ops = &ops;
    try {
      write_file_atomic(path, content('n'), o);
      ADD_FAILURE() << "no error with a fault at " << file_step_name(c.step);
    } catch (const IoError& e) {
      const std::string w = e.what();
      EXPECT_EQ(e.step(), c.step) << w;
      EXPECT_EQ(e.path(), path);
      EXPECT_NE(w.find(path), std::string::npos) << w;
      EXPECT_NE(w.find(file_step_name(c.step)), std::string::npos) << w;
      EXPECT_NE(w.find(c.os_error), std::string::npos) << w;
    }
    const auto now = read_file(path);
    if (c.renamed) {
      EXPECT_EQ(now, content('n')) << file_step_name(c.step);
    } else if (had_old) {
      EXPECT_EQ(now, content('o')) << file_step_name(c.step);
    } else {
      EXPECT_FALSE(now.has_value()) << file_step_name(c.step);
    }
    const std::vector<std::string> want =
        c.renamed || had_old ? std::vector<std::string>{"model.safetensors"} : std::vector<std::string>{};
    EXPECT_EQ(d.entries(), want) << "left behind at " << file_step_name(c.step)
                                 << (had_old ? " (old file)" : " (no old file)");
    EXPECT_EQ(ops.open_fds(), 0u) << file_step_name(c.step);
    // The temp file is only ever removed, and only when the rename did not happen.
    const bool unlinked = std::find(ops.trace.begin(), ops.trace.end(), "unlink") != ops.trace.end();
    EXPECT_EQ(unlinked, !c.renamed && c.fault != Fault::CreateTemp) << file_step_name(c.step);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryStep, WriteFileAtomicFault,
                         ::testing::Values(StepCase{Fault::CreateTemp, FileStep::CreateTemp, false,
                                                    "Permission denied"},
                                           StepCase{Fault::Write, FileStep::Write, false, "No space left"},
                                           StepCase{Fault::ShortWrite, FileStep::Write, false, "No space left"},
                                           StepCase{Fault::SyncFile, FileStep::SyncFile, false, "Input/output error"},
                                           StepCase{Fault::CloseFile, FileStep::CloseFile, false, "Input/output error"},
                                           StepCase{Fault::Rename, FileStep::Rename, false, "Input/output error"},
                                           StepCase{Fault::OpenDir, FileStep::OpenDir, true, "Input/output error"},
                                           StepCase{Fault::SyncDir, FileStep::SyncDir, true, "Input/output error"}),
                         step_case_name);

// Writes that store a few bytes at a time, or are interrupted, are continued.
class DribbleOps : public FileOps {
 public:
  ssize_t write(int fd, const void* data, size_t bytes) override {
    if (++calls % 5 == 0) {
      errno = EINTR;
      return -1;
    }
    return FileOps::write(fd, data, std::min<size_t>(bytes, 7));
  }
  int calls = 0;
};

TEST(WriteFileAtomic, ShortAndInterruptedWritesAreContinued) {
  TempDir d;
  DribbleOps ops;
  AtomicWriteOptions o;
  o.ops = &ops;
  const std::string want = content('s', 5000);
  write_file_atomic(d.file("x"), want, o);
  EXPECT_EQ(read_file(d.file("x")), want);
  EXPECT_GT(ops.calls, 5000 / 7);
}

// An exception from a streaming writer propagates as it was; the old file stays.
TEST(WriteFileAtomic, WriterExceptionPropagatesAndRemovesTheTemp) {
  TempDir d;
  const std::string path = d.file("manifest.json");
  put(path, "old");
  try {
    write_file_atomic(path, [](FileSink& out) {
      out.write("half of it");
      EXPECT_EQ(out.bytes_written(), 10u);
      throw InvalidArgument("tensor 'wte' has a bad shape");
    });
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "tensor 'wte' has a bad shape");
  }
  EXPECT_EQ(read_file(path), "old");
  EXPECT_EQ(d.entries(), std::vector<std::string>{"manifest.json"});
}

TEST(WriteFileAtomic, StreamsLargeContentWithWriteback) {
  TempDir d;
  FaultyOps ops(Fault::None);
  AtomicWriteOptions o;
  o.ops = &ops;
  const std::string chunk = content('c', 1 << 20);
  write_file_atomic(
      d.file("big"),
      [&](FileSink& out) {
        for (int i = 0; i < 70; ++i) out.write(chunk);
      },
      o);
  EXPECT_EQ(std::filesystem::file_size(d.file("big")), 70u << 20);
  // Writeback starts after each completed 32 MiB: twice in 70 MiB.
  EXPECT_EQ(std::count(ops.trace.begin(), ops.trace.end(), "writeback"), 2);
}

// O_DIRECT: every mix of aligned and unaligned buffers, of whole blocks and
// odd sizes, gives exactly the bytes written, in order, with their SHA-256
// (the staging buffer, the zero-copy path and the buffered tail all used).
TEST(WriteFileAtomic, DirectWritesGiveTheSameBytes) {
  TempDir d;
  std::string all;
  for (size_t i = 0; i < (size_t{3} << 20) + 4096 + 17; ++i) all += static_cast<char>((i * 2654435761u) >> 13);
  char* aligned = static_cast<char*>(std::aligned_alloc(4096, (all.size() + 4095) / 4096 * 4096));
  ASSERT_NE(aligned, nullptr);
  std::copy(all.begin(), all.end(), aligned);
  // Pieces from the unaligned string: a header (staged), more small pieces,
  // then 300 blocks from an unaligned address (staged, flushed a MiB at a time).
  const std::vector<std::pair<size_t, size_t>> writes = {{0, 8}, {8, 100}, {108, 4096 * 300}, {108 + 4096 * 300, 5}};
  for (int variant = 0; variant < 2; ++variant) {
    const std::string path = d.file("direct" + std::to_string(variant));
    std::string sha;
    AtomicWriteOptions o;
    o.direct = true;
    o.sha256_hex = &sha;
    write_file_atomic(
        path,
        [&](FileSink& out) {
          if (variant == 0) {  // everything from the aligned copy: whole blocks go straight, the tail buffered
            out.write(aligned, size_t{2} << 20);
            out.write(aligned + (size_t{2} << 20), all.size() - (size_t{2} << 20));
            return;
          }
          size_t at = 0;
          for (const auto& [off, n] : writes) {
            out.write(all.data() + off, n);
            at = off + n;
          }
          out.write(aligned + at, all.size() - at);  // unaligned address inside the aligned copy: staged
        },
        o);
    EXPECT_EQ(read_file(path), all) << variant;
    EXPECT_EQ(sha, sha256_hex(all)) << variant;
  }
  std::free(aligned);
}

TEST(WriteFileAtomic, BadPathsNameThePath) {
  TempDir d;
  try {
    write_file_atomic(d.file("no/such/dir/plan.json"), "x");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.step(), FileStep::CreateTemp);
    EXPECT_EQ(e.os_error(), ENOENT);
    EXPECT_NE(std::string(e.what()).find(d.file("no/such/dir/plan.json")), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_file_atomic(d.path() + "/", "x"), InvalidArgument);
  // A name near NAME_MAX still gets a temp file (its name is shortened).
  const std::string long_name(250, 'n');
  write_file_atomic(d.file(long_name), "long");
  EXPECT_EQ(read_file(d.file(long_name)), "long");
  EXPECT_EQ(d.entries(), std::vector<std::string>{long_name});
}

TEST(WriteFileAtomic, ModeIsTheOptionLessTheUmask) {
  TempDir d;
  AtomicWriteOptions o;
  o.mode = 0600;
  write_file_atomic(d.file("secret"), "k", o);
  struct stat st {};
  ASSERT_EQ(::stat(d.file("secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const mode_t mask = ::umask(022);
  write_file_atomic(d.file("shared"), "k");
  ::umask(mask);
  ASSERT_EQ(::stat(d.file("shared").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

// Three processes of two threads each overwrite one path with their own
// content while the parent reads it: every read is one writer's whole
// content, and the writers never collide on a temp name.
TEST(WriteFileAtomic, ConcurrentWritersNeverTearTheFile) {
  TempDir d;
  const std::string path = d.file("shared.bin");
  const size_t n = 256 << 10;
  write_file_atomic(path, std::string(n, 'A'));
  std::vector<pid_t> kids;
  for (int p = 0; p < 3; ++p) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int bad = 0;
      auto writer = [&](char tag) {
        for (int i = 0; i < 25; ++i) {
          try {
            write_file_atomic(path, std::string(n, tag));
          } catch (const std::exception&) {
            bad = 1;
          }
        }
      };
      std::thread t(writer, static_cast<char>('B' + 2 * p));
      writer(static_cast<char>('C' + 2 * p));
      t.join();
      ::_exit(bad);
    }
    kids.push_back(pid);
  }
  int reads = 0, torn = 0;
  std::set<char> seen;
  auto all_done = [&] {
    for (pid_t& k : kids) {
      int st = 0;
      if (k > 0 && ::waitpid(k, &st, WNOHANG) == k) {
        EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "a writer failed";
        k = 0;
      }
    }
    return std::all_of(kids.begin(), kids.end(), [](pid_t k) { return k == 0; });
  };
  while (!all_done()) {
    const auto s = read_file(path);
    ASSERT_TRUE(s.has_value());
    ++reads;
    if (s->size() != n || s->find_first_not_of((*s)[0]) != std::string::npos)
      ++torn;
    else
      seen.insert((*s)[0]);
  }
  EXPECT_EQ(torn, 0) << "of " << reads << " reads";
  EXPECT_GT(reads, 0);
  EXPECT_GE(seen.size(), 2u);  // the readers did see the writers take turns
  EXPECT_EQ(d.entries(), std::vector<std::string>{"shared.bin"});
}

// FIPS 180-4 / NIST CSRC example vectors.
TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a' through the file reader (several 1 MiB reads).
  char tmpl[] = "/tmp/tessera_sha_XXXXXX";
  int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  const std::string a(1000000, 'a');
  ASSERT_EQ(::write(fd, a.data(), a.size()), static_cast<ssize_t>(a.size()));
  ::close(fd);
  EXPECT_EQ(sha256_file_hex(tmpl), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  ::unlink(tmpl);
}

TEST(OpenRegularFile, RefusesFifosWithoutBlocking) {
  char tmpl[] = "/tmp/tessera_fifo_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string fifo = std::string(tmpl) + "/p";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    read_regular_file(fifo, 100);
    ADD_FAILURE() << "no throw";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(fifo + ": not a regular file (a FIFO)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sha256_file_hex(tmpl), FormatError);  // a directory
  ::unlink(fifo.c_str());
  ::rmdir(tmpl);
}

}  // namespace
// ---- stale temporaries (remove_stale_temps) ---------------------------------

namespace {

// A pid that was a process of ours a moment ago and is now dead (reaped).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// A live process other than this one: a child that sleeps until killed.
struct LiveChild {
  pid_t pid = ::fork();
  LiveChild() {
    if (pid == 0) {
      ::pause();
      ::_exit(0);
    }
  }
  ~LiveChild() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

}  // namespace

TEST(TempOwner, ReadsThePidAfterThePrefixOnly) {
  EXPECT_EQ(temp_owner(".a.tmp.123.Qx81Zp", ".a.tmp."), 123);
  EXPECT_EQ(temp_owner(".out.tmp-4711", ".out.tmp-"), 4711);
  EXPECT_EQ(temp_owner("tessera-bench-99-job_1-AbCdEf", "tessera-bench-"), 99);
  EXPECT_EQ(temp_owner(".a.tmp.Qx81Zp", ".a.tmp."), 0);      // the old name without a pid
  EXPECT_EQ(temp_owner(".a.tmp.123x.Qx", ".a.tmp."), 0);     // digits must end at '.', '-' or the end
  EXPECT_EQ(temp_owner(".a.tmp.", ".a.tmp."), 0);            // no pid at all
  EXPECT_EQ(temp_owner(".b.tmp.123.Qx81Zp", ".a.tmp."), 0);  // another file's temp
  EXPECT_EQ(temp_owner(".a.tmp.0.x", ".a.tmp."), 0);
  EXPECT_EQ(temp_owner(".a.tmp.99999999999999999999.x", ".a.tmp."), 0);  // no such pid, and no overflow
}

TEST(RemoveStaleTemps, RemovesADeadProcesssTempsAndKeepsALiveOnes) {
  TempDir d;
  LiveChild live;
  ASSERT_GT(live.pid, 0);
  const pid_t dead = dead_pid();
  ASSERT_FALSE(process_alive(dead));
  ASSERT_TRUE(process_alive(live.pid));
  const std::string dead_file = ".m.safetensors.tmp." + std::to_string(dead) + ".Qx81Zp";
  const std::string live_file = ".m.safetensors.tmp." + std::to_string(live.pid) + ".Ab12Cd";
  const std::string own_file = ".m.safetensors.tmp." + std::to_string(::getpid()) + ".Ef34Gh";
  put(d.file(dead_file), "dead");
  put(d.file(live_file), "live");
  put(d.file(own_file), "own");
  put(d.file("m.safetensors"), "final");
  put(d.file(".m.safetensors.tmp.Qx81Zp"), "no pid");  // not of our form: left alone
  // A directory of a dead process, with content (a killed `ckpt reshard`).
  const std::string dead_dir = ".out.tmp-" + std::to_string(dead);
  const std::string live_dir = ".out.tmp-" + std::to_string(live.pid);
  ASSERT_TRUE(std::filesystem::create_directory(d.file(dead_dir)));
  ASSERT_TRUE(std::filesystem::create_directory(d.file(live_dir)));
  put(d.file(dead_dir + "/model.safetensors"), "half");

  auto removed = remove_stale_temps(d.path(), ".m.safetensors.tmp.");
  EXPECT_EQ(removed, std::vector<std::string>{d.file(dead_file)});
  removed = remove_stale_temps(d.path(), ".out.tmp-");
  EXPECT_EQ(removed, std::vector<std::string>{d.file(dead_dir)});
  std::vector<std::string> want{".m.safetensors.tmp.Qx81Zp", live_dir, live_file, own_file, "m.safetensors"};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(d.entries(), want);
  EXPECT_EQ(read_file(d.file(live_file)), "live");
}

TEST(RemoveStaleTemps, KeepsADeadPidsFileThatIsStillLocked) {
  // A writer in another PID namespace: its pid means nothing here, but the
  // flock write_file_atomic holds on its temp file does.
  TempDir d;
  const std::string name = ".f.tmp." + std::to_string(dead_pid()) + ".Qx81Zp";
  put(d.file(name), "x");
  const int fd = ::open(d.file(name).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  EXPECT_TRUE(remove_stale_temps(d.path(), ".f.tmp.").empty());
  EXPECT_EQ(d.entries(), std::vector<std::string>{name});
  ::close(fd);  // the lock goes with the last descriptor: now it is stale
  EXPECT_EQ(remove_stale_temps(d.path(), ".f.tmp.").size(), 1u);
  EXPECT_TRUE(d.entries().empty());
}

TEST(RemoveStaleTemps, KeepsADeadPidsDirectoryWhileItsOwnerLives) {
  // A bench in another PID namespace (a test host of the multihost rig)
  // sharing /tmp: the pid in its directory's name means nothing here, the
  // lock make_owned_temp_dir holds for the owner's lifetime does.
  TempDir d;
  const std::string tmpl = d.file("tessera-bench-" + std::to_string(dead_pid()) + "-XXXXXX");
  int to_child[2], from_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(from_child), 0);
  const pid_t owner = ::fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) {
    const std::string made = make_owned_temp_dir(tmpl);
    const char ok = made.size() == tmpl.size() ? 1 : 0;
    char go = 0;
    if (::write(from_child[1], &ok, 1) != 1 || ::read(to_child[0], &go, 1) != 1) ::_exit(1);
    ::_exit(0);  // the lock goes with the process
  }
  char ok = 0;
  ASSERT_EQ(::read(from_child[0], &ok, 1), 1);
  ASSERT_EQ(ok, 1);
  ASSERT_EQ(d.entries().size(), 1u);
  EXPECT_TRUE(remove_stale_temps(d.path(), "tessera-bench-").empty());
  EXPECT_EQ(d.entries().size(), 1u);
  const char go = 1;
  ASSERT_EQ(::write(to_child[1], &go, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(owner, &status, 0), owner);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) ::close(fd);
  EXPECT_EQ(remove_stale_temps(d.path(), "tessera-bench-").size(), 1u);
  EXPECT_TRUE(d.entries().empty());
}

TEST(MakeOwnedTempDir, NamesTheTemplateWhenItCannotCreate) {
  try {
    make_owned_temp_dir("/nonexistent/tessera-dir/x-XXXXXX");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tessera-dir/x-"), std::string::npos) << e.what();
  }
}

TEST(RemoveStaleTemps, MissingDirectoryIsNotAnError) {
  EXPECT_TRUE(remove_stale_temps("/nonexistent/tessera-dir", ".x.tmp.").empty());
}

TEST(OutputTempOwner, ReadsBothFormsOfAnyOutput) {
  EXPECT_EQ(output_temp_owner(".plan.json.tmp.123.Qx81Zp"), 123);
  EXPECT_EQ(output_temp_owner(".a.tmp.b.tmp.77.Ab12Cd"), 77);  // the last ".tmp." is the writer's
  EXPECT_EQ(output_temp_owner(".out.tmp-4711"), 4711);
  EXPECT_EQ(output_temp_owner(".a-b.tmp-9"), 9);
  EXPECT_EQ(output_temp_owner("plan.json.tmp.123.Qx81Zp"), 0);  // no leading dot: not ours
  EXPECT_EQ(output_temp_owner("out.tmp-4711"), 0);
  EXPECT_EQ(output_temp_owner(".tmp-4711"), 0);          // no output name
  EXPECT_EQ(output_temp_owner("..tmp.1.Qx81Zp"), 0);     // no output name
  EXPECT_EQ(output_temp_owner(".a.tmp.123"), 0);         // no random suffix
  EXPECT_EQ(output_temp_owner(".a.tmp.123.Qx81"), 0);    // a suffix of 4
  EXPECT_EQ(output_temp_owner(".a.tmp.123.Qx-1Zp"), 0);  // not [A-Za-z0-9]
  EXPECT_EQ(output_temp_owner(".a.tmp.12x.Qx81Zp"), 0);  // not a pid
  EXPECT_EQ(output_temp_owner(".a.tmp-12x"), 0);
  EXPECT_EQ(output_temp_owner(".a.tmp-"), 0);
  EXPECT_EQ(output_temp_owner(".a.tmp.0.Qx81Zp"), 0);
  EXPECT_EQ(output_temp_owner(".a.tmp-99999999999999999999"), 0);
  EXPECT_EQ(output_temp_owner(".step_00000002.tmp"), 0);  // the trainer's (no pid): not for this cleaner
}

// What killed writers left next to an output, for it or for any other
// output there (a killed `ckpt shard --out a`, the next run writing b),
// goes; a live writer's, a name not of tessera's forms and the durable-only
// rule stay.
TEST(WriteFileAtomic, RemovesDeadWritersTempsOfEveryOutputInItsDirectoryAndKeepsLiveOnes) {
  TempDir d;
  LiveChild live;
  const std::string dead_tmp = ".plan.json.tmp." + std::to_string(dead_pid()) + ".Qx81Zp";
  const std::string live_tmp = ".plan.json.tmp." + std::to_string(live.pid) + ".Ab12Cd";
  const std::string other_dead = ".other.json.tmp." + std::to_string(dead_pid()) + ".Qx81Zp";
  const std::string other_live = ".other.json.tmp." + std::to_string(live.pid) + ".Qx81Zp";
  const std::string dead_dir = ".out.tmp-" + std::to_string(dead_pid());
  const std::string live_dir = ".out2.tmp-" + std::to_string(live.pid);
  const std::string not_ours = "notes.tmp-" + std::to_string(dead_pid());
  put(d.file(dead_tmp), "left by a killed writer");
  put(d.file(live_tmp), "being written");
  put(d.file(other_dead), "another output's, its writer killed");
  put(d.file(other_live), "another output's, being written");
  ASSERT_TRUE(std::filesystem::create_directory(d.file(dead_dir)));
  put(d.file(dead_dir + "/rank_tp0_pp0.safetensors"), "half written");
  ASSERT_TRUE(std::filesystem::create_directory(d.file(live_dir)));
  put(d.file(not_ours), "the user's");
  write_file_atomic(d.file("plan.json"), "{}");
  std::vector<std::string> want{live_tmp, other_live, live_dir, not_ours, "plan.json"};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(d.entries(), want);
  // The FileStore's keys (sync off) skip the listing.
  const std::string dead_key = ".k.tmp." + std::to_string(dead_pid()) + ".Qx81Zp";
  put(d.file(dead_key), "");
  AtomicWriteOptions fast;
  fast.sync = false;
  write_file_atomic(d.file("k"), "v", fast);
  EXPECT_TRUE(std::filesystem::exists(d.file(dead_key)));
  // A step log (OutputStream) cleans up too.
  OutputStream log(d.file("log.jsonl"));
  log.close();
  EXPECT_FALSE(std::filesystem::exists(d.file(dead_key)));
  EXPECT_TRUE(std::filesystem::exists(d.file(live_tmp)));
}

// Through FileOps: a writer killed between creating its temp and the
// rename (its pid then dead: a forked child killed at that point) leaves
// the temp, which the next durable write of another file removes.
TEST(WriteFileAtomic, AKilledWritersTempGoesWithTheNextWriteOfAnotherFile) {
  TempDir d;
  class KillAtRename : public FileOps {
   public:
    int rename(const char*, const char*) override { ::_exit(9); }
  };
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    KillAtRename ops;
    AtomicWriteOptions o;
    o.ops = &ops;
    write_file_atomic(d.file("a.json"), "{}", o);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 9);
  const std::vector<std::string> left = d.entries();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(output_temp_owner(left[0]), child) << left[0];
  write_file_atomic(d.file("b.json"), "{}");
  EXPECT_EQ(d.entries(), std::vector<std::string>{"b.json"});
}

TEST(TempDirectory, IsTmpdirOrTmp) {
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  ::setenv("TMPDIR", "/var/tmp/x", 1);
  EXPECT_EQ(temp_directory(), "/var/tmp/x");
  ::setenv("TMPDIR", "", 1);
  EXPECT_EQ(temp_directory(), "/tmp");
  ::unsetenv("TMPDIR");
  EXPECT_EQ(temp_directory(), "/tmp");
  if (old) ::setenv("TMPDIR", saved.c_str(), 1);
}

}  // namespace tessera
