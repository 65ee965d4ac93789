// Baselines measured in the same run as the benchmark (docs/bench.md), and
// the gnuplot plot.

// clang-format off
// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>
#include <boost/asio.hpp>
// clang-format on

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <sstream>
#include <thread>

#include "collectives/bench/bench.h"
#include "collectives/host.h"
#include "collectives/tcp/tcp_transport.h"
#include "runtime/error.h"
#include "runtime/files.h"

namespace tessera::collectives::bench {
namespace {

namespace asio = boost::asio;
namespace tcp_transport = tessera::collectives::tcp;
using asio::ip::tcp;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Pre-faulted anonymous memory.
struct Mem {
  explicit Mem(size_t n) : n_(std::max<size_t>(n, 1)) {
    p_ = mmap(nullptr, n_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p_ == MAP_FAILED) throw Error("baseline: cannot map " + std::to_string(n_) + " bytes");
    std::memset(p_, 1, n_);
  }
  ~Mem() { munmap(p_, n_); }
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;
  void* p_;
  size_t n_;
};

// The baseline streams four times: with fixed socket buffers
// (TESSERA_TCP_SOCKBUF bytes, else 4 MiB) and with the kernel's buffer
// autotuning (the TCP transport's default), both with TCP_NODELAY, each over
// one connection carrying both directions and over two connections, one per
// direction (as the transport wires a peer pair), and reports the best of
// each figure, so it is the best raw TCP here, not only what the transport's
// settings get.
void tune(tcp::socket& s, bool fixed_buffers) {
  const int fixed = tcp_transport::socket_buffer_bytes() > 0 ? tcp_transport::socket_buffer_bytes() : 4 << 20;
  tcp_transport::set_socket_options(s, fixed_buffers ? fixed : 0);
}

// Both ends run the same script: phase 1, A streams to B; phase 2, both stream
// at once. Each phase starts on a one-byte go and ends with a one-byte ack, so
// A's clock covers the whole transfer. With `s2` (the pair's second
// connection), phase 2 sends A's data on `s` and B's on `s2`. Returns A's
// figures (B returns zeros).
TcpBaseline run_stream(tcp::socket& s, tcp::socket* s2, bool is_a, size_t bytes, int reps) {
  Mem sbuf(bytes), rbuf(bytes);
  char b = 0;
  TcpBaseline out;
  const double total = static_cast<double>(bytes) * reps;
  // Phase 1: one direction.
  if (is_a) {
    asio::write(s, asio::buffer(&b, 1));
    double t0 = now_s();
    for (int i = 0; i < reps; ++i) asio::write(s, asio::buffer(sbuf.p_, bytes));
    asio::read(s, asio::buffer(&b, 1));
    out.unidir_gbps = total / (now_s() - t0) / 1e9;
  } else {
    asio::read(s, asio::buffer(&b, 1));
    for (int i = 0; i < reps; ++i) asio::read(s, asio::buffer(rbuf.p_, bytes));
    asio::write(s, asio::buffer(&b, 1));
  }
  // Phase 2: both directions at once; a reader thread per side.
  if (is_a)
    asio::write(s, asio::buffer(&b, 1));
  else
    asio::read(s, asio::buffer(&b, 1));
  double t0 = now_s();
  boost::system::error_code rec;
  tcp::socket& rd = (s2 && is_a) ? *s2 : s;
  tcp::socket& wr = (s2 && !is_a) ? *s2 : s;
  std::thread reader([&] {
    for (int i = 0; i < reps && !rec; ++i) asio::read(rd, asio::buffer(rbuf.p_, bytes), rec);
  });
  boost::system::error_code wec;
  for (int i = 0; i < reps && !wec; ++i) asio::write(wr, asio::buffer(sbuf.p_, bytes), wec);
  reader.join();
  if (rec || wec) throw Error("TCP baseline: transfer failed: " + (rec ? rec : wec).message());
  if (is_a) {
    asio::read(s, asio::buffer(&b, 1));
    out.bidir_gbps = total / (now_s() - t0) / 1e9;
  } else {
    asio::write(s, asio::buffer(&b, 1));
  }
  return out;
}

}  // namespace

TcpBaseline measure_tcp_loopback(Communicator& comm, size_t bytes, int reps) {
  asio::io_context io;
  TcpBaseline res;
  auto best = [&](const TcpBaseline& b) {
    res.unidir_gbps = std::max(res.unidir_gbps, b.unidir_gbps);
    res.bidir_gbps = std::max(res.bidir_gbps, b.bidir_gbps);
  };
  if (comm.size() >= 2) {
    // Ranks 0 (A) and 1 (B); rank 1 listens and shares its port. On
    // different hosts it listens on the address the TCP transport would
    // advertise, so the figure is the network between them.
    int64_t key = static_cast<int64_t>(std::hash<std::string>{}(this_host().key) >> 1);
    comm.broadcast(&key, 1, DType::I64, 0);
    int64_t ep[2] = {0, 0};  // port, IPv4 address (0: loopback)
    std::unique_ptr<tcp::acceptor> acc;
    if (comm.rank() == 1) {
      const bool remote = key != static_cast<int64_t>(std::hash<std::string>{}(this_host().key) >> 1);
      const auto ip = asio::ip::make_address_v4(tcp_transport::advertised_address(remote, comm.options().reach));
      acc = std::make_unique<tcp::acceptor>(io, tcp::endpoint(ip.is_loopback() ? ip : asio::ip::address_v4::any(), 0));
      ep[0] = acc->local_endpoint().port();
      ep[1] = ip.is_loopback() ? 0 : static_cast<int64_t>(ip.to_uint());
    }
    comm.broadcast(ep, 2, DType::I64, 1);
    const auto peer = ep[1] ? asio::ip::address_v4(static_cast<uint32_t>(ep[1])) : asio::ip::address_v4::loopback();
    for (int variant = 0; variant < 4; ++variant) {
      const bool fixed_buffers = variant % 2 == 0, two = variant >= 2;
      tcp::socket s(io), s2(io);
      if (comm.rank() == 0) {
        s.connect(tcp::endpoint(peer, static_cast<uint16_t>(ep[0])));
        if (two) s2.connect(tcp::endpoint(peer, static_cast<uint16_t>(ep[0])));
      } else if (comm.rank() == 1) {
        acc->accept(s);
        if (two) acc->accept(s2);
      }
      if (comm.rank() <= 1) {
        tune(s, fixed_buffers);
        if (two) tune(s2, fixed_buffers);
        const TcpBaseline b = run_stream(s, two ? &s2 : nullptr, comm.rank() == 0, bytes, reps);
        if (comm.rank() == 0) best(b);
      }
    }
    comm.barrier();
    return res;
  }
  // One rank: a forked child is the peer (it only runs this code, then exits).
  tcp::acceptor acc(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
  const auto ep = acc.local_endpoint();
  pid_t pid = fork();
  if (pid < 0) throw Error("TCP baseline: fork failed");
  if (pid == 0) {
    int code = 0;
    try {
      asio::io_context cio;
      for (int variant = 0; variant < 4; ++variant) {
        const bool two = variant >= 2;
        tcp::socket s(cio), s2(cio);
        s.connect(ep);
        if (two) s2.connect(ep);
        tune(s, variant % 2 == 0);
        if (two) tune(s2, variant % 2 == 0);
        run_stream(s, two ? &s2 : nullptr, false, bytes, reps);
      }
    } catch (...) {
      code = 1;
    }
    _exit(code);
  }
  for (int variant = 0; variant < 4; ++variant) {
    const bool two = variant >= 2;
    tcp::socket s(io), s2(io);
    acc.accept(s);
    if (two) acc.accept(s2);
    tune(s, variant % 2 == 0);
    if (two) tune(s2, variant % 2 == 0);
    best(run_stream(s, two ? &s2 : nullptr, true, bytes, reps));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return res;
}

namespace {

std::string plot_data(const Report& r) {
  std::ostringstream d;
  d << "# size_bytes oop_busbw ip_busbw modeled_busbw compare_busbw\n";
  for (const auto& row : r.rows) {
    if (row.size_bytes == 0) continue;  // no place on a log axis
    d << row.size_bytes << " " << row.oop.busbw_gbps << " " << (row.ip ? row.ip->busbw_gbps : 0) << " "
      << row.modeled_busbw_gbps << " " << row.compare_busbw_gbps.value_or(0) << "\n";
  }
  return d.str();
}

std::string plot_script(const Report& r, const std::string& png, const std::string& dat) {
  std::ostringstream g;
  g << "set terminal pngcairo size 960,600 noenhanced\n"
    << "set output '" << png << "'\n"
    << "set title 'tessera bench " << r.op << ": " << r.ranks << " ranks, " << r.transport << ", " << r.dtype << "'\n"
    << "set logscale x 2\nset xlabel 'size (bytes)'\nset ylabel 'busbw (GB/s)'\nset grid\nset key left top\n"
    << "set format x '%.0b %BB'\n"
    << "plot '" << dat << "' using 1:2 with linespoints title 'out-of-place'";
  bool ip = false;
  for (const auto& row : r.rows) ip |= row.ip.has_value();
  if (ip) g << ", '' using 1:3 with linespoints title 'in-place'";
  bool modeled = false;
  for (const auto& row : r.rows) modeled |= row.modeled_busbw_gbps > 0;
  if (modeled) g << ", '' using 1:4 with linespoints dashtype 2 title 'modeled'";  // points: one size is one point
  if (!r.compare.empty()) g << ", '' using 1:5 with linespoints title '" << r.compare << "'";
  if (r.memcpy_gbps) g << ", " << *r.memcpy_gbps << " with lines title 'memcpy baseline'";
  if (r.tcp_loopback_gbps) g << ", " << *r.tcp_loopback_gbps << " with lines title 'TCP loopback baseline'";
  g << "\n";
  return g.str();
}

}  // namespace

// gnuplot draws into a private temp directory; the PNG then goes to `png`
// through write_file_atomic (a character device or FIFO written through,
// never replaced). FILE.dat and FILE.gp are left next to a regular (or new)
// `png` only: next to a device they would land in /dev.
void plot_png(const Report& r, const std::string& png) {
  namespace fs = std::filesystem;
  const std::string tmp = make_owned_temp_dir(
      (fs::path(temp_directory()) / ("tessera-bench-" + std::to_string(::getpid()) + "-plot-XXXXXX")).string());
  struct Remove {
    std::string dir;
    ~Remove() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove{tmp};
  const std::string tdat = tmp + "/plot.dat", tgp = tmp + "/plot.gp", tpng = tmp + "/plot.png";
  write_file_atomic(tdat, plot_data(r), {.sync = false});
  write_file_atomic(tgp, plot_script(r, tpng, tdat), {.sync = false});
  const std::string cmd = "gnuplot '" + tgp + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw Error("--plot: cannot run gnuplot");
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, p)) out += buf;
  int rc = pclose(p);
  if (rc != 0 || !fs::exists(tpng))
    throw Error("--plot: gnuplot failed to draw '" + png + "' (is the Debian package gnuplot installed?): " + out);
  write_file_atomic(png, read_regular_file(tpng, uint64_t{1} << 30));
  const OutputKind kind = classify_output(png).kind;
  if (kind == OutputKind::Regular || kind == OutputKind::New) {
    const fs::path dat = fs::path(png).replace_extension(".dat");
    const fs::path gp = fs::path(png).replace_extension(".gp");
    write_file_atomic(dat.string(), plot_data(r));
    write_file_atomic(gp.string(), plot_script(r, png, dat.string()));
  }
}

}  // namespace tessera::collectives::bench
