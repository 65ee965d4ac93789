// The binaries against a careless or hostile user (issue 32; docs/errors.md,
// "Outputs", "Inputs", "Messages"): every output of every command given a
// character device (mknod c 1 3, /dev/null's numbers) or a FIFO leaves it a
// device or a FIFO; every JSON input given /dev/zero, a FIFO, a directory or
// a 1 GB file is refused at once in little memory; a full device
// (/dev/full's numbers: ENOSPC) fails the run naming the file; library text does not
// reach the user.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/checkpoint/test_util.h"
#include "tests/runtime/special_files.h"
#include "tests/test_timeouts.h"

namespace {

namespace fs = std::filesystem;
using tessera::testing::FifoReader;
using tessera::testing::is_fifo;
using tessera::testing::is_null_device;
using tessera::testing::TempDir;

// HARDENING_TESSERA_BIN / HARDENING_TRAIN_GPT_BIN run the cases against other
// binaries (an older build, to see the cases fail there).
std::string bin(const char* env, const char* built) {
  const char* v = std::getenv(env);
  return v && *v ? v : built;
}
const std::string kTessera = bin("HARDENING_TESSERA_BIN", TESSERA_BIN);
const std::string kTrainBin = bin("HARDENING_TRAIN_GPT_BIN", TRAIN_GPT_BIN);
const std::string kTrain = "OPENBLAS_NUM_THREADS=1 TESSERA_TIMEOUT_S=60 " + kTrainBin;
const std::string kTiny = " --steps 1 --layers 1 --hidden 32 --heads 2 --seq 16 --vocab 256 --micro-batch 1";
const std::string kTiny2 = " --steps 1 --layers 2 --hidden 32 --heads 2 --seq 16 --vocab 256 --micro-batch 1";
const std::string kPlanArgs = " plan --model gpt2-124m --topology trn1.32xlarge --global-batch 8 --seq 128 --top 1";
const std::string kBench = " bench allr -r 2 -b 1K -e 4K -f 2 -n 1 -w 0";

// A command run through `sh -c 'exec ...'`: its exit code, its output
// (stdout and stderr), its peak RSS (wait4) and how long it took. A command
// still running after 120 s (HARDENING_TIMEOUT_S) is killed: code 128 + 9, "timed out".
struct CmdRun {
  int code = -1;
  std::string out;
  long max_rss_kib = 0;
  double seconds = 0;
  double cpu_seconds = 0;  // user + system (wait4), which load on the machine does not change
};
CmdRun run(const std::string& cmd) {
  char tmpl[] = "/tmp/tessera_hard_out_XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd < 0) return {};
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl("/bin/sh", "sh", "-c", ("exec env " + cmd).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int st = 0;
  rusage ru{};
  bool timed_out = false;
  while (::wait4(pid, &st, WNOHANG, &ru) == 0) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(std::stoi(bin("HARDENING_TIMEOUT_S", "120")))) {
      ::kill(pid, SIGKILL);
      timed_out = true;
      ::wait4(pid, &st, 0, &ru);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CmdRun r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.max_rss_kib = ru.ru_maxrss;
  r.cpu_seconds = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                  1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  ::close(fd);
  r.out = tessera::testing::read_bytes(tmpl);
  if (timed_out) r.out += "\n(timed out: killed)";
  ::unlink(tmpl);
  return r;
}

// Runs `cmd` and expects a usage error: exit 2 and `says` in the output
// (the command in the failure message). The run is returned for more checks.
CmdRun refused(const std::string& cmd, const std::string& says) {
  CmdRun r = run(cmd);
  EXPECT_EQ(r.code, 2) << cmd << "\n" << r.out;
  EXPECT_NE(r.out.find(says), std::string::npos) << cmd << "\n" << r.out;
  return r;
}

struct OutputCase {
  std::string name;
  std::function<std::string(const std::string& out)> cmd;  // the command writing `out`
  int code;                                                // 0: written through; 2: refused
};

std::vector<OutputCase> output_cases(const TempDir& d) {
  return {
      {"plan --json", [](const std::string& o) { return kTessera + kPlanArgs + " --json " + o; }, 0},
      {"bench --json", [](const std::string& o) { return kTessera + kBench + " --json " + o; }, 0},
      {"bench --plot", [](const std::string& o) { return kTessera + kBench + " --plot " + o; }, 0},
      {"train_gpt --export", [](const std::string& o) { return kTrain + kTiny + " --export " + o; }, 0},
      {"train_gpt --log-json", [](const std::string& o) { return kTrain + kTiny + " --log-json " + o; }, 0},
      {"train_gpt --trace",
       [](const std::string& o) {
         return "TESSERA_TIMEOUT_S=60 OPENBLAS_NUM_THREADS=1 " + kTessera + " run --nproc-per-node 2 -- " + kTrainBin +
                kTiny2 + " --pp 2 --trace " + o;
       },
       0},
      // The ckpt commands refuse an --out that exists (docs/checkpoint.md).
      {"ckpt consolidate --out",
       [&d](const std::string& o) { return kTessera + " ckpt consolidate --out " + o + " " + d.file("shards"); }, 2},
      {"ckpt shard --out",
       [&d](const std::string& o) {
         return kTessera + " ckpt shard --tp 1 --out " + o + " " + d.file("m.safetensors");
       },
       2},
      {"ckpt reshard --out",
       [&d](const std::string& o) { return kTessera + " ckpt reshard --tp 1 --out " + o + " " + d.file("shards"); }, 2},
      // --save names a directory of checkpoints: a device or a FIFO there is refused at start-up.
      {"train_gpt --save", [](const std::string& o) { return kTrain + kTiny + " --save " + o; }, 2},
  };
}

// Weights and a shard directory for the ckpt commands.
void make_checkpoint(const TempDir& d) {
  CmdRun r = run(kTrain + kTiny + " --export " + d.file("m.safetensors"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run(kTessera + " ckpt shard --tp 1 --out " + d.file("shards") + " " + d.file("m.safetensors"));
  ASSERT_EQ(r.code, 0) << r.out;
}

TEST(HardeningCli, EveryOutputToACharacterDeviceLeavesTheDevice) {
  TempDir d;
  make_checkpoint(d);
  for (const OutputCase& c : output_cases(d)) {
    SCOPED_TRACE(c.name);
    const std::string dev = d.file("dev");
    fs::remove_all(dev);  // what a case that failed left there too
    if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) GTEST_SKIP() << "mknod: " << std::strerror(errno);
    const CmdRun r = run(c.cmd(dev));
    EXPECT_EQ(r.code, c.code) << r.out;
    if (c.code != 0) {
      EXPECT_NE(r.out.find(dev), std::string::npos) << "refused without naming it: " << r.out;
    }
    EXPECT_TRUE(is_null_device(dev)) << "replaced: " << c.name;
  }
  // Nothing left beside the device (no temp file, no FILE.dat in its place).
  for (const auto& e : fs::directory_iterator(d.path())) {
    const std::string n = e.path().filename().string();
    EXPECT_TRUE(n == "dev" || n == "m.safetensors" || n == "shards") << n;
  }
}

TEST(HardeningCli, EveryOutputToAFifoWritesThroughToItsReader) {
  TempDir d;
  make_checkpoint(d);
  for (const OutputCase& c : output_cases(d)) {
    SCOPED_TRACE(c.name);
    const std::string fifo = d.file("fifo");
    fs::remove_all(fifo);
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    std::string got;
    CmdRun r;
    {
      FifoReader reader(fifo);
      r = run(c.cmd(fifo));
      if (c.code == 0)
        got = reader.take();
      else
        reader.stop();
    }
    EXPECT_EQ(r.code, c.code) << r.out;
    if (c.code != 0) {
      EXPECT_NE(r.out.find(fifo), std::string::npos) << "refused without naming it: " << r.out;
    }
    EXPECT_TRUE(is_fifo(fifo)) << "replaced: " << c.name;
    if (c.code == 0) {
      EXPECT_FALSE(got.empty()) << "the reader got nothing";
    }
    if (c.name == "plan --json" || c.name == "bench --json" || c.name == "train_gpt --trace") {
      EXPECT_EQ(got.substr(0, 1), "{") << got.substr(0, 200);
    }
    if (c.name == "bench --plot") {
      EXPECT_EQ(got.substr(1, 3), "PNG");
    }
  }
}

TEST(HardeningCli, AFifoWithoutAReaderIsRefusedNotWaitedFor) {
  TempDir d;
  const std::string fifo = d.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const CmdRun r = run(kTessera + kPlanArgs + " --json " + fifo);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(fifo + ": cannot open the FIFO for writing: no process has it open for reading"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(is_fifo(fifo));
}

TEST(HardeningCli, AFullDeviceFailsTheRunNamingTheFile) {
  // A node with /dev/full's numbers in a temp dir: a binary that wrongly
  // replaces its output replaces that, never the system's /dev/full.
  TempDir d;
  const std::string full = tessera::testing::full_device(d.path());
  // NOLINTBEGIN(performance-inefficient-string-concatenation): test commands, built once
  for (const std::string& cmd : {kTrain + kTiny + " --log-json " + full, kTrain + kTiny + " --export " + full,
                                 kTessera + kPlanArgs + " --json " + full, kTessera + kBench + " --json " + full}) {
    // NOLINTEND(performance-inefficient-string-concatenation)
    SCOPED_TRACE(cmd);
    const CmdRun r = run(cmd);
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(full + ": cannot write: No space left on device"), std::string::npos) << r.out;
    struct stat st {};
    ASSERT_EQ(::lstat(full.c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << "replaced";
  }
}

TEST(HardeningCli, EveryJsonInputRefusesDevZeroFifoDirectoryAndHugeFileAtOnce) {
  TempDir d;
  tessera::testing::BadInputs bad;
  ASSERT_TRUE(tessera::testing::make_bad_inputs(d.path(), &bad));
  const std::vector<std::function<std::string(const std::string&)>> inputs = {
      [](const std::string& f) {
        return kTessera + " plan --model " + f + " --topology trn1.32xlarge --global-batch 8 --seq 128";
      },
      [](const std::string& f) {
        return kTessera + " plan --model gpt2-124m --topology " + f + " --global-batch 8 --seq 128";
      },
      [](const std::string& f) { return kTessera + kBench + " --topology " + f; },
      [](const std::string& f) { return kTrain + kTiny + " --plan " + f; },
  };
  for (const auto& cmd : inputs) {
    for (const std::string& f : {std::string("/dev/zero"), bad.fifo, bad.dir, bad.big}) {
      const std::string c = cmd(f);
      SCOPED_TRACE(c);
      const CmdRun r = run(c);
      EXPECT_EQ(r.code, 2) << r.out;
      EXPECT_NE(r.out.find(f), std::string::npos) << r.out;
      // The whole process, start-up included (the reader's own < 0.1 s: runtime_test Inputs.*): its CPU
      // time (reading /dev/zero would take far more), and a wall time that only a wait (a blocking FIFO) passes.
      EXPECT_LT(r.cpu_seconds, 5.0);
      EXPECT_LT(r.seconds, tessera::test_time::seconds(30));
      EXPECT_LE(r.max_rss_kib, 64 * 1024) << r.out;
    }
  }
}

// train_gpt's own JSON inputs (--model, --topology, and --init DIR's
// config.json): /dev/zero, a FIFO, a directory and a 1 GB sparse file are
// refused at once (exit 2, little CPU and memory, no wait on the FIFO), the
// message naming the file.
TEST(HardeningCli, TrainGptJsonInputsRefuseDevZeroFifoDirectoryAndHugeFileAtOnce) {
  TempDir d;
  tessera::testing::BadInputs bad;
  ASSERT_TRUE(tessera::testing::make_bad_inputs(d.path(), &bad));
  // A Hugging Face directory (config.json and model.safetensors) for --init.
  CmdRun r = run(kTrain + kTiny + " --export " + d.file("hf"));
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(fs::is_regular_file(d.file("hf/config.json"))) << r.out;
  // --init DIR whose config.json is the bad thing (/dev/zero: a symlink to it).
  int n = 0;
  auto init_dir = [&](const std::string& kind) {
    std::string dir = d.file("init" + std::to_string(n++));
    fs::create_directory(dir);
    fs::copy_file(d.file("hf/model.safetensors"), dir + "/model.safetensors");
    const std::string config = dir + "/config.json";
    if (kind == "/dev/zero") fs::create_symlink("/dev/zero", config);
    if (kind == "fifo") {
      EXPECT_EQ(::mkfifo(config.c_str(), 0600), 0);
    }
    if (kind == "dir") fs::create_directory(config);
    if (kind == "big") {
      std::ofstream(config).put(' ');
      fs::resize_file(config, uint64_t{1} << 30);  // sparse: no blocks written
    }
    return dir;
  };
  struct Case {
    std::string cmd, names;  // the command, and the file its message must name
  };
  // NOLINTBEGIN(performance-inefficient-string-concatenation): test commands, built once
  const std::string model = kTrain + " --steps 1 --micro-batch 1 --model ";
  const std::string topology = kTrain + kTiny + " --topology ";
  const std::string init = kTrain + " --steps 1 --micro-batch 1 --seq 16 --init ";
  // NOLINTEND(performance-inefficient-string-concatenation)
  std::vector<Case> cases;
  for (const std::string& f : {std::string("/dev/zero"), bad.fifo, bad.dir, bad.big}) {
    cases.push_back({model + f, f});
    cases.push_back({topology + f, f});
  }
  for (const char* kind : {"/dev/zero", "fifo", "dir", "big"}) {
    const std::string dir = init_dir(kind);
    cases.push_back({init + dir, dir + "/config.json"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.cmd);
    r = run(c.cmd);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(c.names), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("json.exception"), std::string::npos) << r.out;
    EXPECT_LT(r.cpu_seconds, 5.0);
    EXPECT_LT(r.seconds, tessera::test_time::seconds(30));
    EXPECT_LE(r.max_rss_kib, 64 * 1024) << r.out;
  }
}

// A FIFO, a directory or a device named without a slash (`--topology ff` in
// the directory that holds ff) is a file the reader refuses, not an unknown
// preset name: the message says what the thing named is (a directory as
// --model, what a Hugging Face directory would hold).
TEST(HardeningCli, AnInputNamedWithoutASlashIsTakenAsTheFileItIs) {
  TempDir d;
  ASSERT_EQ(::mkfifo(d.file("ff").c_str(), 0600), 0);
  ASSERT_TRUE(fs::create_directory(d.file("dd")));
  const std::string plan = kTessera + " plan --global-batch 8 --seq 128";
  for (const std::string& name : {std::string("ff"), std::string("dd")}) {
    const std::string says = name == "ff" ? "not a regular file (a FIFO)" : "not a regular file (a directory)";
    for (const auto& [args, what] :
         {std::pair{" --model " + name + " --topology trn1.32xlarge", std::string("model file")},
          std::pair{" --model gpt2-124m --topology " + name, std::string("topology file")}}) {
      std::string cmd = "-C " + d.path();
      cmd += " ";
      cmd += plan;
      cmd += args;
      SCOPED_TRACE(cmd);
      const CmdRun r = run(cmd);
      EXPECT_EQ(r.code, 2) << r.out;
      std::string want = what;
      want += " '";
      want += name;
      want += "': ";
      want += says;
      // A directory given as --model is read as a Hugging Face directory: it says what it lacks.
      if (name == "dd" && what == "model file") want = "model 'dd': a directory without config.json";
      EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
      EXPECT_LT(r.seconds, tessera::test_time::seconds(30));
    }
  }
}

TEST(HardeningCli, LibraryTextDoesNotReachTheUser) {
  TempDir d;
  struct Case {
    std::string file, text, cmd, says;
  };
  const std::string topo = " --topology trn1.32xlarge --global-batch 8 --seq 128";
  for (const Case& c : {
           Case{"two.json", R"({"tp": "two"})", kTrain + kTiny + " --plan ",
                "field 'tp': expected an integer from -2147483648 to 2147483647, found string \"two\""},
           Case{"array.json", "[1, 2]", kTrain + kTiny + " --plan ", "the plan: expected a JSON object, found array"},
           Case{"cut.json", R"({"tp": 1)", kTrain + kTiny + " --plan ", "malformed JSON: at line 1, column 9"},
           Case{"big.json", R"({"tp": 2147483648})", kTrain + kTiny + " --plan ", "field 'tp': expected an integer"},
           Case{"nested.json", R"({"memory_bytes_per_rank": {"params": -1}})", kTrain + kTiny + " --plan ",
                "field 'memory_bytes_per_rank.params': expected a non-negative integer, found number -1"},
           Case{"unknown.json", R"({"colour": 2})", kTrain + kTiny + " --plan ",
                "unknown field 'colour' (allowed: model,"},
           // NOLINTNEXTLINE(performance-inefficient-string-concatenation): a test command
           Case{"model.json", R"({"layers": 4)", kTessera + " plan" + topo + " --model ",
                "model file '" + d.file("model.json") + "': malformed JSON: at line 1, column 13"},
           Case{"topo.json", R"({"device": )",
                kTessera + " plan --model gpt2-124m --global-batch 8 --seq 128 --topology ",
                "topology file '" + d.file("topo.json") + "': malformed JSON: at line 1"},
       }) {
    SCOPED_TRACE(c.file);
    std::ofstream(d.file(c.file)) << c.text;
    const CmdRun r = run(c.cmd + d.file(c.file));
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
    for (const char* lib : {"json.exception", "Root element", "TYPE_INT32", "TYPE_UINT64", "INVALID_ARGUMENT"})
      EXPECT_EQ(r.out.find(lib), std::string::npos) << r.out;
  }
}

TEST(HardeningCli, BenchRefusesStepFactorZeroAsItRefusesAHalf) {
  for (const char* f : {"0", "0.5", "1"})
    refused(kTessera + " bench allr -r 2 -b 1K -e 4K -f " + f, "-f/--stepfactor must be > 1, got");
  // NaN is the flag's "not given" inside: a given nan ran as the default factor 2.
  for (const char* f : {"nan", "inf"}) refused(kTessera + " bench allr -r 2 -b 1K -e 4K -f " + f, "--stepfactor");
}

// --root and --algo are checked before any rank starts: one message, not one per rank.
TEST(HardeningCli, BenchChecksRootAndAlgoBeforeTheRanksStart) {
  for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"broadcast -r 8 --root 9", "--root 9 is not a rank of 8"},
           {"broadcast -r 2 --root -1", "--root -1 is not a rank of 2"},
           {"allr -r 3 --algo bogus", "--algo: unknown collective algorithm 'bogus' (known: "},
           {"allr -r 4 --topology emulated:2", "--topology emulated:2 has 2 cores, fewer than the 4 ranks"}}) {
    std::string cmd = kTessera + " bench ";
    cmd += flags;
    cmd += " -b 8 -e 8 -n 1";
    const CmdRun r = refused(cmd, says);
    const size_t at = r.out.find(says);
    EXPECT_EQ(r.out.find(says, at + 1), std::string::npos) << "said more than once:\n" << r.out;
  }
}

// An output that passes access() but cannot be created (a name too long,
// /proc) is refused before the run, not after it.
TEST(HardeningCli, BenchOutputThatCannotBeCreatedIsRefusedFirst) {
  TempDir d;
  for (const std::string& path : {d.file(std::string(260, 'a') + ".json"), std::string("/proc/x.json")}) {
    std::string cmd = kTessera + " bench allr -r 2 -b 8 -e 64 -n 1 --json ";
    cmd += path;
    const CmdRun r = refused(cmd, "--json: cannot write");
    EXPECT_EQ(r.out.find("algbw"), std::string::npos) << "the bench ran first:\n" << r.out;
  }
}

// An empty path where a path is taken is a usage error (`plan --json ""`
// wrote nothing and said nothing).
TEST(HardeningCli, AnEmptyPathIsRefused) {
  for (const char* flags : {" plan --model gpt2-124m --topology trn1.32xlarge --global-batch 32 --seq 128 --json ''",
                            " bench allr -r 2 -b 8 -e 64 -n 1 --plot ''", " ckpt consolidate --out '' x",
                            " run --nproc-per-node 1 --log-dir '' -- true"}) {
    std::string cmd = kTessera;
    cmd += flags;
    refused(cmd, "expected a value, got an empty string");
  }
}

// Sizes past what the planner's counts hold are refused naming the flag
// (--global-batch 99999999999 wrapped to "needs at least one micro-batch
// (got -1536674723)", and 2^32 + 16 planned).
TEST(HardeningCli, PlanAndGenerateSizesBeyondTheirRangesNameTheFlag) {
  refused(kTessera + " plan --model gpt2-124m --topology trn1.32xlarge --seq 128 --global-batch 99999999999",
          "--global-batch: must be an integer from 1 to 16777216, got 99999999999");
  const CmdRun wrap = run(kTessera +
                          " plan --model gpt2-124m --topology emulated:8 --seq 128 --global-batch 4294967312 "
                          "--dp 2 --pp 1 --tp 4 --mbs 8");
  EXPECT_EQ(wrap.code, 2) << wrap.out;
  // Pins that cannot hold (docs/planner.md, 4: ZeRO-1 needs dp > 1, SP tp > 1), and preset counts.
  for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"--topology emulated:4 --tp 4 --dp 1 --pp 1 --zero1 on", "--zero1 on needs dp > 1"},
           {"--topology emulated:8 --tp 1 --dp 8 --pp 1 --sequence-parallel on", "--sequence-parallel on needs tp > 1"},
           {"--topology torus4d:2x2x2x2x", "expected torus4d:AxBxCxD"},
           {"--topology emulated:99999999999", "is more than 16777216"}}) {
    std::string cmd = kTessera + " plan --model gpt2-124m --global-batch 16 --seq 128 ";
    cmd += flags;
    refused(cmd, says);
  }
  // A --mbs that divides no rank's share names itself (the message blamed interleaving, not asked for).
  refused(
      kTessera +
          " plan --model gpt2-124m --topology trn1.32xlarge --global-batch 8 --seq 128 --dp 4 --mbs 4 --tp 4 --pp 2",
      "--mbs 4 divides no data-parallel rank's share of the global batch (global batch / dp = 2)");
}

// --plot FILE writes FILE's .dat and .gp beside it: an image named x.dat was
// its own data file (exit 0, no PNG).
TEST(HardeningCli, BenchRefusesAPlotNamedLikeItsDataOrScript) {
  TempDir d;
  for (const char* name : {"x.dat", "x.gp"}) {
    refused(kTessera + " bench allr -r 2 -b 8 -e 64 -n 1 --plot " + d.file(name),
            "would be overwritten by the plot's own");
    EXPECT_FALSE(fs::exists(d.file(name)));
  }
}

TEST(HardeningCli, RunNamesTheProgramItCannotExecuteAndWhy) {
  TempDir d;
  const std::string bad = d.file("badelf");
  std::ofstream(bad) << "\x7f"
                        "ELF not really";
  ::chmod(bad.c_str(), 0755);
  const CmdRun r = run("TESSERA_TIMEOUT_S=30 " + kTessera + " run --nproc-per-node 1 -- " + bad);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("cannot execute '" + bad + "': Exec format error"), std::string::npos) << r.out;
}

TEST(HardeningCli, ABadCoordinatorAddressIsNamedWithItsVariable) {
  // Port 1 on loopback: nothing listens there.
  const CmdRun r =
      run("TESSERA_COORDINATOR=127.0.0.1:1 TESSERA_JOB_TOKEN=t TESSERA_RANK=0 TESSERA_WORLD_SIZE=1 " + kTrain + kTiny);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("TESSERA_COORDINATOR=127.0.0.1:1: cannot reach the coordinator"), std::string::npos) << r.out;
}

TEST(HardeningCli, AWorkerThatReachesNoCoordinatorAddressNamesEach) {
  // Neither the Unix socket (nobody serves the name) nor the TCP port: the
  // error lists both, each with its variable, not only the last one tried.
  const std::string local = "unix-abstract:tessera-nobody-" + std::to_string(getpid());
  const CmdRun r = run("TESSERA_COORDINATOR=127.0.0.1:1 TESSERA_COORDINATOR_LOCAL=" + local +
                       " TESSERA_JOB_TOKEN=t TESSERA_RANK=0 TESSERA_WORLD_SIZE=1 " + kTrain + kTiny);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("TESSERA_COORDINATOR_LOCAL=" + local + ": cannot reach the coordinator"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("TESSERA_COORDINATOR=127.0.0.1:1: cannot reach the coordinator"), std::string::npos) << r.out;
}

}  // namespace

namespace {

TEST(HardeningCli, ResumeLatestRefusesADoneMarkerThatIsNotAFile) {
  TempDir d;
  const std::string model = " --layers 1 --hidden 32 --heads 2 --seq 16 --vocab 256 --micro-batch 1";
  const std::string ck = d.file("ck");
  CmdRun r = run(kTrain + model + " --steps 2 --save " + ck);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string done = ck + "/step_00000002/done";
  ASSERT_TRUE(fs::remove(done));
  ASSERT_EQ(::mkfifo(done.c_str(), 0600), 0);
  r = run(kTrain + model + " --steps 3 --save " + ck + " --resume latest");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(done + ": the done marker is not a regular file"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("starting at step 0"), std::string::npos) << r.out;
  EXPECT_TRUE(is_fifo(done));
}

}  // namespace
