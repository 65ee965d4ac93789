// The output and input rules of docs/errors.md (runtime/files.h):
// write_file_atomic and OutputStream never replace what is not a regular
// file (a character device or FIFO is written through, a directory, block
// device or socket refused), every write failure is reported (a full device),
// and read_input_file refuses /dev/zero, a FIFO, a directory and a 1 GB
// file at once, in little memory. Plus library text in tessera's words.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "runtime/files.h"
#include "runtime/library_text.h"
#include "tests/runtime/special_files.h"
#include "tests/test_timeouts.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class Dir {
 public:
  Dir() {
    std::string t = (fs::temp_directory_path() / "tessera_outin_XXXXXX").string();
    if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp");
    path_ = t;
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& n) const { return path_ + "/" + n; }
  size_t entries() const {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(path_)) ++n;
    return n;
  }

 private:
  std::string path_;
};

using testing::FifoReader;
using testing::is_fifo;
using testing::is_null_device;
using testing::make_null_device;

TEST(Outputs, CharacterDeviceIsWrittenThroughNeverReplaced) {
  Dir d;
  const std::string dev = d.file("n");
  if (!make_null_device(dev)) GTEST_SKIP() << "mknod: " << std::strerror(errno);
  write_file_atomic(dev, std::string(300'000, 'x'));  // large enough for the splice path
  EXPECT_TRUE(is_null_device(dev));
  std::string hash;
  AtomicWriteOptions o;
  o.sha256_hex = &hash;
  write_file_atomic(dev, "abc", o);
  EXPECT_TRUE(is_null_device(dev));
  EXPECT_EQ(hash, sha256_hex("abc"));
  write_files_atomic({dev, d.file("plain")}, [](const std::vector<FileSink*>& s) {
    s[0]->write("a");
    s[1]->write("b");
  });
  EXPECT_TRUE(is_null_device(dev));
  EXPECT_EQ(d.entries(), 2u);  // the device and "plain": no temp file left
}

TEST(Outputs, SymlinkToDeviceWritesThroughAndSymlinkToFileReplacesTheFile) {
  Dir d;
  const std::string link = d.file("stdout");
  ASSERT_EQ(::symlink("/dev/null", link.c_str()), 0);  // as /dev/stdout -> /proc/self/fd/1
  write_file_atomic(link, "x");
  EXPECT_TRUE(fs::is_symlink(link));
  std::ofstream(d.file("target")) << "old";
  const std::string flink = d.file("flink");
  ASSERT_EQ(::symlink("target", flink.c_str()), 0);
  write_file_atomic(flink, "new");
  EXPECT_TRUE(fs::is_symlink(flink));  // the link stays a link (cp's rule)
  std::ifstream f(d.file("target"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), "new");
  ASSERT_EQ(::symlink("missing", d.file("dangling").c_str()), 0);
  try {
    write_file_atomic(d.file("dangling"), "x");
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    EXPECT_EQ(e.step(), FileStep::CheckOutput);
    EXPECT_NE(std::string(e.what()).find("symbolic link to a missing file"), std::string::npos) << e.what();
  }
}

TEST(Outputs, FifoWithAReaderGetsTheBytesAndStaysAFifo) {
  Dir d;
  const std::string p = d.file("p");
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  FifoReader reader(p);
  const std::string want(200'000, 'q');
  write_file_atomic(p, want);
  EXPECT_EQ(reader.take(), want);
  EXPECT_TRUE(is_fifo(p));
  EXPECT_EQ(d.entries(), 1u);
}

TEST(Outputs, FifoWithoutAReaderIsRefusedAtOnce) {
  Dir d;
  const std::string p = d.file("p");
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  const test_time::Cost cost;
  for (const auto& write :
       std::vector<std::function<void()>>{[&] { write_file_atomic(p, "x"); }, [&] { OutputStream s(p); }}) {
    try {
      write();
      ADD_FAILURE() << "no throw";
    } catch (const IoError& e) {
      EXPECT_EQ(e.step(), FileStep::OpenOutput);
      EXPECT_EQ(e.os_error(), ENXIO);
      EXPECT_NE(std::string(e.what()).find(p + ": cannot open the FIFO for writing: no process has it open"),
                std::string::npos)
          << e.what();
    }
  }
  // Without O_NONBLOCK the open would wait for a reader forever: any bound tells; scaled, as load delays a process.
  EXPECT_LT(cost.wall_seconds(), test_time::seconds(5));
  EXPECT_TRUE(is_fifo(p));
}

TEST(Outputs, FifoWhoseReaderLeftIsEpipeNotSigpipe) {
  Dir d;
  const std::string p = d.file("p");
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  const int r = ::open(p.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(r, 0);
  OutputStream s(p);
  ::close(r);  // the reader goes away
  try {
    s.write("line\n");
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    EXPECT_EQ(e.os_error(), EPIPE);
  }
  // Still alive: the SIGPIPE was held back and consumed.
  sigset_t pending;
  sigemptyset(&pending);
  ::sigpending(&pending);
  EXPECT_EQ(sigismember(&pending, SIGPIPE), 0);
}

TEST(Outputs, DirectorySocketAndBlockDeviceAreRefusedAndLeftAlone) {
  Dir d;
  std::vector<std::string> refused{d.file("sub")};
  ASSERT_EQ(::mkdir(refused[0].c_str(), 0700), 0);
  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string sp = d.file("s");
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", sp.c_str());
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  refused.push_back(sp);
  if (::mknod(d.file("b").c_str(), S_IFBLK | 0600, makedev(7, 0)) == 0) refused.push_back(d.file("b"));
  for (const std::string& p : refused) {
    SCOPED_TRACE(p);
    struct stat before {};
    ASSERT_EQ(::lstat(p.c_str(), &before), 0);
    try {
      write_file_atomic(p, "x");
      ADD_FAILURE() << "no throw";
    } catch (const IoError& e) {
      EXPECT_EQ(e.step(), FileStep::CheckOutput);
      EXPECT_NE(std::string(e.what()).find(p + ": cannot write: it is a"), std::string::npos) << e.what();
    }
    EXPECT_THROW(OutputStream{p}, IoError);
    EXPECT_FALSE(output_refusal(p).empty());
    struct stat after {};
    ASSERT_EQ(::lstat(p.c_str(), &after), 0);
    EXPECT_EQ(after.st_mode, before.st_mode);
    EXPECT_EQ(after.st_ino, before.st_ino);
  }
  ::close(sock);
  EXPECT_TRUE(output_refusal(d.file("new")).empty());
  EXPECT_TRUE(output_refusal("/dev/null").empty());
}

TEST(Outputs, FullDeviceFailsTheWriteNamingThePath) {
  // A full device (/dev/full's numbers): every write gives ENOSPC, as a full disk does.
  Dir d;
  const std::string full = testing::full_device(d.path());
  try {
    write_file_atomic(full, std::string(100, 'x'));
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    EXPECT_EQ(e.step(), FileStep::Write);
    EXPECT_EQ(e.os_error(), ENOSPC);
    EXPECT_EQ(std::string(e.what()), full + ": cannot write: No space left on device");
  }
  OutputStream s(full);
  try {
    s.write("{\"step\": 1}\n");
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    EXPECT_EQ(e.os_error(), ENOSPC);
    EXPECT_NE(std::string(e.what()).find(full + ": cannot write"), std::string::npos) << e.what();
  }
  struct stat st {};
  ASSERT_EQ(::lstat(full.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST(Outputs, OutputStreamWritesARegularFileInPlace) {
  Dir d;
  const std::string p = d.file("log.json");
  std::ofstream(p) << "old content, longer than the new";
  OutputStream s(p);
  s.write("a\n");
  s.write("b\n");
  s.close();
  std::ifstream f(p);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), "a\nb\n");
  const std::string dev = d.file("n");
  if (make_null_device(dev)) {
    OutputStream n(dev);
    n.write("x\n");
    n.close();
    EXPECT_TRUE(is_null_device(dev));
  }
}

// A regular-file step log (`--log-json`) on a full disk, through FileOps:
// every call goes through the seam, and the injected ENOSPC fails the write
// naming the path; the file stays a (regular, empty) file.
TEST(Outputs, OutputStreamOnAFullDiskFailsTheWriteNamingThePath) {
  class FullDiskOps : public FileOps {
   public:
    int open(const char* path, int flags, mode_t mode) override {
      ++opens;
      return FileOps::open(path, flags, mode);
    }
    ssize_t write(int, const void*, size_t) override {
      ++writes;
      errno = ENOSPC;
      return -1;
    }
    int fsync(int fd) override {
      ++fsyncs;
      return FileOps::fsync(fd);
    }
    int close(int fd) override {
      ++closes;
      return FileOps::close(fd);
    }
    int opens = 0, writes = 0, fsyncs = 0, closes = 0;
  } ops;
  Dir d;
  const std::string p = d.file("log.jsonl");
  OutputStream s(p, {.ops = &ops});
  EXPECT_EQ(ops.opens, 1);
  try {
    s.write("{\"step\": 1}\n");
    ADD_FAILURE() << "the write did not fail";
  } catch (const IoError& e) {
    EXPECT_EQ(e.step(), FileStep::Write);
    EXPECT_EQ(e.os_error(), ENOSPC);
    EXPECT_EQ(e.path(), p);
    EXPECT_EQ(std::string(e.what()), p + ": cannot write: No space left on device");
  }
  EXPECT_EQ(ops.writes, 1);
  s.close();
  EXPECT_EQ(ops.fsyncs, 1);
  EXPECT_EQ(ops.closes, 1);
  struct stat st {};
  ASSERT_EQ(::lstat(p.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 0);
}

// `append` (tessera run's rank logs after a restart) keeps what is there.
TEST(Outputs, OutputStreamAppendsWhenAsked) {
  Dir d;
  const std::string p = d.file("rank_0.log");
  std::ofstream(p) << "round 0\n";
  OutputStream s(p, {.append = true});
  s.write("round 1\n");
  s.close();
  std::ifstream f(p);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), "round 0\nround 1\n");
}

// ---- inputs -------------------------------------------------------------------

// Runs `fn` in a forked child; returns its peak RSS in KiB and whether it succeeded.
struct ChildRun {
  bool ok;
  long max_rss_kib;
  double seconds;
};
ChildRun in_child(const std::function<bool()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(fn() ? 0 : 1);
  int st = 0;
  rusage ru{};
  ::wait4(pid, &st, 0, &ru);
  return {WIFEXITED(st) && WEXITSTATUS(st) == 0, ru.ru_maxrss,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

TEST(Inputs, DevZeroFifoDirectoryAndHugeFileAreRefusedAtOnceInLittleMemory) {
  Dir d;
  testing::BadInputs bad;
  ASSERT_TRUE(testing::make_bad_inputs(d.path(), &bad));
  const std::string &fifo = bad.fifo, &dir = bad.dir, &big = bad.big;
  struct Case {
    std::string path, says;
  };
  for (const Case& c : {Case{"/dev/zero", "not a regular file (a character device)"},
                        Case{fifo, "not a regular file (a FIFO)"}, Case{dir, "not a regular file (a directory)"},
                        Case{big, "1073741824 bytes, more than the limit of 67108864"}}) {
    SCOPED_TRACE(c.path);
    const test_time::Cost cost;
    try {
      read_input_file(c.path, "model file");
      ADD_FAILURE() << "no throw";
    } catch (const FormatError& e) {
      EXPECT_EQ(std::string(e.what()), "model file '" + c.path + "': " + c.says);
    }
    // Under 0.1 s of CPU (reading /dev/zero or the 1 GB file would take far more); the wall time only
    // bounds a wait (a blocking open of the FIFO), with slack, as a loaded machine delays any process.
    EXPECT_LT(cost.cpu_seconds(), 0.1);
    EXPECT_LT(cost.wall_seconds(), test_time::seconds(2));
    // The same in a child, whose whole peak RSS is measured.
    const ChildRun r = in_child([&] {
      try {
        read_input_file(c.path, "model file");
      } catch (const FormatError&) {
        return true;
      }
      return false;
    });
    EXPECT_TRUE(r.ok);
    EXPECT_LE(r.max_rss_kib, 64 * 1024);
  }
}

TEST(Inputs, AMissingFileIsTheCallersBadArgument) {
  try {
    read_input_file("/nonexistent/model.json", "model file");
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "model file '/nonexistent/model.json': no such file");
  }
}

TEST(Inputs, ReadsAtMostOnePastTheLimit) {
  Dir d;
  const std::string p = d.file("ok.json");
  std::ofstream(p) << "{\"a\": 1}";
  EXPECT_EQ(read_input_file(p, "plan file"), "{\"a\": 1}");
  EXPECT_EQ(read_input_file(p, "plan file", 8), "{\"a\": 1}");
  EXPECT_THROW(read_input_file(p, "plan file", 7), FormatError);
}

TEST(LibraryText, NlohmannTagsAreDropped) {
  EXPECT_EQ(json_library_text("[json.exception.parse_error.101] parse error at line 1, column 9: syntax error while "
                              "parsing value - unexpected end of input; expected '[', '{', or a literal"),
            "at line 1, column 9: syntax error while parsing value - unexpected end of input; expected '[', '{', or "
            "a literal");
  EXPECT_EQ(json_library_text("[json.exception.type_error.302] type must be number, but is string"),
            "must be number, but is string");
  EXPECT_EQ(json_library_text("plain words"), "plain words");
}

}  // namespace
}  // namespace tessera
