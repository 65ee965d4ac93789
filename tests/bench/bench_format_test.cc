// The bench's arithmetic and formats, against hand-computed values.
#include <gtest/gtest.h>

#include <sstream>

#include "collectives/bench/bench.h"
#include "runtime/error.h"

namespace tessera::collectives::bench {
namespace {

TEST(BenchOps, NamesIncludingNccomShortNames) {
  EXPECT_EQ(parse_bench_op("all_reduce"), BenchOp::AllReduce);
  EXPECT_EQ(parse_bench_op("allr"), BenchOp::AllReduce);
  EXPECT_EQ(parse_bench_op("allg"), BenchOp::AllGather);
  EXPECT_EQ(parse_bench_op("redsct"), BenchOp::ReduceScatter);
  EXPECT_EQ(parse_bench_op("alltoall"), BenchOp::AllToAll);
  EXPECT_EQ(parse_bench_op("all_to_all"), BenchOp::AllToAll);
  EXPECT_EQ(parse_bench_op("broadcast"), BenchOp::Broadcast);
  EXPECT_EQ(parse_bench_op("reduce"), BenchOp::Reduce);
  EXPECT_EQ(parse_bench_op("sendrecv"), BenchOp::SendRecv);
  EXPECT_THROW(parse_bench_op("allreduce2"), InvalidArgument);
}

TEST(BenchFactors, MatchNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::AllReduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::AllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::AllReduce, 8), 1.75);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::AllReduce, 1), 0.0);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::AllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::ReduceScatter, 8), 0.875);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::AllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::Broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::Reduce, 3), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::SendRecv, 5), 1.0);
}

TEST(BenchSizes, UnitsAndErrors) {
  EXPECT_EQ(parse_size("8"), 8u);
  EXPECT_EQ(parse_size("64K"), 65536u);
  EXPECT_EQ(parse_size("64k"), 65536u);
  EXPECT_EQ(parse_size("1M"), 1048576u);
  EXPECT_EQ(parse_size("1MB"), 1048576u);
  EXPECT_EQ(parse_size("1MiB"), 1048576u);
  EXPECT_EQ(parse_size("1G"), 1073741824u);
  EXPECT_EQ(parse_size("0"), 0u);
  for (const char* bad : {"", "M", "1.5M", "-1", "12X", "1MM", "99999999999999999999"})
    EXPECT_THROW(parse_size(bad), InvalidArgument) << bad;
}

TEST(BenchSizes, SweepByFactorAndByStep) {
  EXPECT_EQ(size_sweep(8, 64, 2, 0), (std::vector<size_t>{8, 16, 32, 64}));
  EXPECT_EQ(size_sweep(8, 100, 4, 0), (std::vector<size_t>{8, 32}));
  EXPECT_EQ(size_sweep(100, 400, 0, 100), (std::vector<size_t>{100, 200, 300, 400}));
  EXPECT_EQ(size_sweep(64, 64, 0, 0), (std::vector<size_t>{64}));
  EXPECT_EQ(size_sweep(0, 4, 2, 0), (std::vector<size_t>{0, 1, 2, 4}));
  EXPECT_THROW(size_sweep(64, 8, 2, 0), InvalidArgument);
  EXPECT_THROW(size_sweep(8, 64, 0, 0), InvalidArgument);
}

TEST(BenchSizes, RowCountRoundsSplitOpsToRanks) {
  EXPECT_EQ(row_count(BenchOp::AllReduce, 100, DType::F32, 3), 25u);
  EXPECT_EQ(row_count(BenchOp::AllGather, 100, DType::F32, 3), 24u);  // 25 -> multiple of 3
  EXPECT_EQ(row_count(BenchOp::ReduceScatter, 64, DType::BF16, 4), 32u);
  EXPECT_EQ(row_count(BenchOp::AllToAll, 7, DType::I64, 2), 0u);
  EXPECT_EQ(row_count(BenchOp::Broadcast, 7, DType::I64, 2), 0u);
}

// The check values must be exact: compare the closed form with a direct
// serial reduction in every dtype, for group sizes 1..8.
TEST(BenchValues, ExpectedIsTheSerialReductionAndExactInEveryDtype) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg}) {
    for (int n = 1; n <= 8; ++n) {
      for (size_t i = 0; i < 400; ++i) {
        double acc = 0;
        for (int r = 0; r < n; ++r) {
          double v = reduce_input(op, r, n, i);
          if (r == 0)
            acc = v;
          else if (op == ReduceOp::Sum || op == ReduceOp::Avg)
            acc += v;
          else if (op == ReduceOp::Prod)
            acc *= v;
          else if (op == ReduceOp::Min)
            acc = std::min(acc, v);
          else
            acc = std::max(acc, v);
        }
        if (op == ReduceOp::Avg) acc /= n;
        double e = reduce_expected(op, n, i);
        ASSERT_EQ(e, acc) << reduce_op_name(op) << " n=" << n << " i=" << i;
        ASSERT_EQ(e, static_cast<double>(static_cast<int64_t>(e))) << "not an integer";
        for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64}) {
          unsigned char buf[8];
          store(buf, t, 0, e);
          ASSERT_EQ(load(buf, t, 0), e) << dtype_name(t);
        }
      }
    }
  }
}

Report sample_report() {
  Report r;
  r.op = "all_reduce";
  r.transport = "shm";
  r.dtype = "f32";
  r.redop = "sum";
  r.ranks = 4;
  Row a;
  a.size_bytes = 1024;
  a.count = 256;
  a.oop = Result{10.0, 0.1024, 0.1536, 0};
  a.ip = Result{20.0, 0.0512, 0.0768, 2};
  a.modeled_busbw_gbps = 12.5;
  Row b;
  b.size_bytes = 1048576;
  b.count = 262144;
  b.oop = Result{123456.0, 8.0, 12.0, 0};
  b.ip = Result{1000.0, 4.0, 6.0, 0};
  r.rows = {a, b};
  return r;
}

TEST(BenchFormat, AverageIsOverEveryOopAndIpResult) {
  Report r = sample_report();
  EXPECT_DOUBLE_EQ(r.avg_busbw_gbps(), (0.1536 + 0.0768 + 12.0 + 6.0) / 4);
  EXPECT_EQ(r.total_wrong(), 2);
}

TEST(BenchFormat, RowHasTheNcclColumns) {
  Report r = sample_report();
  std::istringstream row(format_row(r, r.rows[0]));
  std::vector<std::string> f;
  for (std::string w; row >> w;) f.push_back(w);
  EXPECT_EQ(f, (std::vector<std::string>{"1024", "256", "f32", "sum", "10.00", "0.10", "0.15", "0", "20.00", "0.05",
                                         "0.08", "2", "12.50"}));
  // Large times lose decimals, as nccl-tests does, to keep the width.
  std::string big = format_row(r, r.rows[1]);
  EXPECT_NE(big.find(" 123456 "), std::string::npos) << big;
}

TEST(BenchFormat, TableHeaderAndFooter) {
  Report r = sample_report();
  r.memcpy_gbps = 10.0;
  std::string t = format_table(r);
  EXPECT_NE(t.find("out-of-place"), std::string::npos);
  EXPECT_NE(t.find("in-place"), std::string::npos);
  for (const char* col :
       {"size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong", "(B)", "(elements)", "(us)", "(GB/s)"})
    EXPECT_NE(t.find(col), std::string::npos) << col;
  EXPECT_NE(t.find("# memcpy baseline (1 core, pre-faulted) : 10.00 GB/s"), std::string::npos);
  EXPECT_EQ(t.find("at once"), std::string::npos) << "no all-ranks memcpy figure was measured";
  r.memcpy_all_gbps = 2.5;
  t = format_table(r);
  EXPECT_NE(t.find("# memcpy baseline (all " + std::to_string(r.ranks) + " ranks at once)  : 2.50 GB/s per rank"),
            std::string::npos)
      << t;
  EXPECT_DOUBLE_EQ(to_json(r)["baselines"]["memcpy_all_gbps"].get<double>(), 2.5);
  // The footer is the last line, with the mean busbw.
  std::string last = t.substr(t.rfind('\n', t.size() - 2) + 1);
  EXPECT_EQ(last, "# Avg bus bandwidth : 4.5576\n");
}

TEST(BenchFormat, CompareColumnsPrintMpiBusbwAndRatio) {
  Report r = sample_report();
  r.compare = "mpi";
  r.rows[1].compare_busbw_gbps = 4.0;
  std::istringstream row(format_row(r, r.rows[1]));
  std::vector<std::string> f;
  for (std::string w; row >> w;) f.push_back(w);
  ASSERT_GE(f.size(), 2u);
  EXPECT_EQ(f[f.size() - 2], "4.00");
  EXPECT_EQ(f.back(), "3.00");  // 12 / 4
}

TEST(BenchFormat, JsonHasTheDocumentedShape) {
  Report r = sample_report();
  r.rows[1].ip.reset();
  r.rows[1].oop.wrong = -1;
  r.tcp_loopback_gbps = 1.5;
  r.tcp_loopback_unidir_gbps = 2.5;
  auto j = to_json(r);
  EXPECT_EQ(j["op"], "all_reduce");
  EXPECT_EQ(j["ranks"], 4);
  EXPECT_EQ(j["transport"], "shm");
  EXPECT_EQ(j["algo"], "auto");
  EXPECT_EQ(j["dtype"], "f32");
  ASSERT_EQ(j["results"].size(), 2u);
  const auto& a = j["results"][0];
  EXPECT_EQ(a["size_bytes"], 1024);
  EXPECT_EQ(a["count"], 256);
  EXPECT_DOUBLE_EQ(a["oop"]["time_us"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(a["oop"]["algbw_gbps"].get<double>(), 0.1024);
  EXPECT_DOUBLE_EQ(a["oop"]["busbw_gbps"].get<double>(), 0.1536);
  EXPECT_EQ(a["oop"]["wrong"], 0);
  EXPECT_EQ(a["ip"]["wrong"], 2);
  EXPECT_DOUBLE_EQ(a["modeled_busbw_gbps"].get<double>(), 12.5);
  EXPECT_TRUE(j["results"][1]["ip"].is_null());
  EXPECT_TRUE(j["results"][1]["oop"]["wrong"].is_null());  // not checked
  EXPECT_DOUBLE_EQ(j["avg_busbw_gbps"].get<double>(), (0.1536 + 0.0768 + 12.0) / 3);
  EXPECT_DOUBLE_EQ(j["baselines"]["tcp_loopback_gbps"].get<double>(), 1.5);
  EXPECT_FALSE(j["baselines"].contains("memcpy_gbps"));
  Report none = sample_report();
  EXPECT_FALSE(to_json(none).contains("baselines"));
}

}  // namespace
}  // namespace tessera::collectives::bench
