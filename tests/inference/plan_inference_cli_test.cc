// `tessera plan --inference` on the command line (launcher/plan_cli.cc): the
// KV bytes per token by hand, and the comparison of the chosen topology
// with the other kind (a one-row ring against trn2.48xlarge's torus, a torus
// or switch against inf2.48xlarge's row) at the same TP: its figures are
// each topology's own plan, its terms add up to the time per output token,
// and the one-row ring is slower per token because its TP all-reduces cross
// more hops.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "tests/checkpoint/test_util.h"

namespace {

using tessera::testing::CommandResult;

CommandResult plan(const std::string& args) {
  return tessera::testing::run_command(std::string(TESSERA_BIN) + " plan --inference --model llama3-8b --batch 4 " +
                                       "--prompt-len 1024 --gen-len 256 " + args);
}

// The line of `out` that starts with `prefix` (after leading spaces), or "".
std::string line_of(const std::string& out, const std::string& prefix) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find_first_not_of(' ');
    if (at != std::string::npos && line.compare(at, prefix.size(), prefix) == 0) return line.substr(at);
  }
  return "";
}

// A comparison row's two figures (this topology, the other).
std::pair<double, double> row(const std::string& out, const std::string& name) {
  const std::string l = line_of(out, name);
  double a = -1, b = -1;
  EXPECT_EQ(std::sscanf(l.c_str() + std::min(l.size(), name.size()), "%lf %lf", &a, &b), 2)
      << name << ": '" << l << "'\n"
      << out;
  return {a, b};
}

// The TPOT column of the table row for `tp`.
double table_tpot(const std::string& out, int tp) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    int t = 0, replicas = 0;
    double w = 0, kv = 0, ttft = 0, tpot = 0;
    long long ctx = 0;
    if (std::sscanf(line.c_str(), "%d %d %lf GiB %lf GiB %lld %lf %lf", &t, &replicas, &w, &kv, &ctx, &ttft, &tpot) ==
            7 &&
        t == tp)
      return tpot;
  }
  ADD_FAILURE() << "no row for tp " << tp << "\n" << out;
  return -1;
}

// Each column's kernels + hop latency + link bandwidth is its time per output token (4 decimals printed).
void expect_terms_add_up(const std::string& out) {
  const auto tpot = row(out, "TPOT ms"), k = row(out, "kernels (HBM, FLOPs) ms"),
             l = row(out, "TP all-reduce hop latency ms"), b = row(out, "TP all-reduce link bandwidth ms");
  EXPECT_NEAR(k.first + l.first + b.first, tpot.first, 2e-4) << out;
  EXPECT_NEAR(k.second + l.second + b.second, tpot.second, 2e-4) << out;
  EXPECT_GT(b.first, 0) << out;  // a few KiB per all-reduce still cost some bandwidth
  EXPECT_GT(b.second, 0) << out;
}

// llama3-8b: 32 layers, 8 K/V heads of 128. At tp 8 each core holds one K/V head: 2 x 32 x 1 x 128 x 2 bytes
// (bf16) = 16384 bytes per token; at tp 4 in fp32, two: 2 x 32 x 2 x 128 x 4 = 65536.
TEST(PlanInferenceCli, KvBytesPerTokenByHand) {
  CommandResult r = plan("--topology inf2.48xlarge --tp 8");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("KV cache per core: 16384 bytes per token (2 x 32 layers x 1 K/V head(s) x 128 head size x 2 "
                       "bytes)"),
            std::string::npos)
      << r.out;
  r = plan("--topology trn2.48xlarge --tp 4 --precision fp32");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("KV cache per core: 65536 bytes per token (2 x 32 layers x 2 K/V head(s) x 128 head size x 4 "
                       "bytes)"),
            std::string::npos)
      << r.out;
}

// inf2.48xlarge's one row against trn2.48xlarge's torus at tp 8, from either side: the same figures
// both ways, each column its topology's own plan; the row is slower per token, by the all-reduces'
// hop latency (tp 8 on inf2 spans 4 chips: the ring closes from chip 3 to chip 0 over 3 chip hops
// plus the step between the chip's 2 cores, 4; on trn2 the 8 cores are one chip, 1 hop).
TEST(PlanInferenceCli, OneRowRingAgainstTheTorus) {
  const CommandResult ring = plan("--topology inf2.48xlarge --tp 8");
  ASSERT_EQ(ring.code, 0) << ring.out;
  const CommandResult torus = plan("--topology trn2.48xlarge --tp 8");
  ASSERT_EQ(torus.code, 0) << torus.out;
  EXPECT_NE(ring.out.find("Why inf2.48xlarge (one-row ring) and trn2.48xlarge (torus) differ for llama3-8b at tp 8:"),
            std::string::npos)
      << ring.out;
  EXPECT_NE(torus.out.find("Why trn2.48xlarge (torus) and inf2.48xlarge (one-row ring) differ for llama3-8b at tp 8:"),
            std::string::npos)
      << torus.out;
  const auto tpot = row(ring.out, "TPOT ms"), back = row(torus.out, "TPOT ms");
  EXPECT_DOUBLE_EQ(tpot.first, back.second);
  EXPECT_DOUBLE_EQ(tpot.second, back.first);
  EXPECT_NEAR(tpot.first, table_tpot(ring.out, 8), 6e-4);  // the table prints 3 decimals
  EXPECT_NEAR(tpot.second, table_tpot(torus.out, 8), 6e-4);
  EXPECT_GT(tpot.first, tpot.second) << "the one-row ring should be slower per output token at tp 8";
  const auto hops = row(ring.out, "TP ring's slowest step, hops");
  EXPECT_EQ(hops.first, 4);
  EXPECT_EQ(hops.second, 1);
  const auto lat = row(ring.out, "TP all-reduce hop latency ms"), k = row(ring.out, "kernels (HBM, FLOPs) ms");
  EXPECT_GT(lat.first, lat.second);
  // The hops make the difference: the latency term differs more than the whole TPOT does (trn2's kernels
  // are slower: less HBM bandwidth per core).
  EXPECT_GT(lat.first - lat.second, tpot.first - tpot.second);
  EXPECT_GT(k.second, k.first);
  EXPECT_NE(ring.out.find("the term that differs most is the per-layer TP all-reduces' latency over hops (65 "
                          "all-reduces per token; the ring's slowest step 4 against 1 hop(s))"),
            std::string::npos)
      << ring.out;
  expect_terms_add_up(ring.out);
  expect_terms_add_up(torus.out);
}

// Trn3 behind NeuronSwitch, 64 and 144 chips: compared with inf2.48xlarge's row at the largest TP both
// hold (24 cores: 8), the switch is faster per token; its columns equal inf2's own plan.
TEST(PlanInferenceCli, SwitchAgainstTheOneRowRing) {
  const CommandResult ring = plan("--topology inf2.48xlarge --tp 8");
  ASSERT_EQ(ring.code, 0) << ring.out;
  const double ring_tpot = row(ring.out, "TPOT ms").first;
  for (const auto& [topo, cores] :
       std::vector<std::pair<std::string, int>>{{"trn3-ultraserver", 512}, {"trn3-ultraserver:144", 1152}}) {
    SCOPED_TRACE(topo);
    const CommandResult r = plan("--topology " + topo + " --tp 16");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("on " + topo + " (" + std::to_string(cores) + " cores of trn3-core"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("Why " + topo +
                         " (switch) and inf2.48xlarge (one-row ring) differ for llama3-8b at tp 8 "
                         "(the largest TP both hold):"),
              std::string::npos)
        << r.out;
    const auto tpot = row(r.out, "TPOT ms");
    EXPECT_DOUBLE_EQ(tpot.second, ring_tpot);
    EXPECT_LT(tpot.first, tpot.second);
    const auto hops = row(r.out, "TP ring's slowest step, hops");
    EXPECT_EQ(hops.first, 1);
    EXPECT_EQ(hops.second, 4);
    expect_terms_add_up(r.out);
  }
}

}  // namespace
