#include "collectives/host.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>

#include "runtime/error.h"

namespace tessera::collectives {

namespace {

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

std::string ns_id(const char* which) {
  char buf[128] = {0};
  const std::string path = std::string("/proc/self/ns/") + which;
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string(which) + ":?";
}

}  // namespace

// The CPUs this process may run on (its affinity: taskset, cpusets, an MPI
// binding), as hex digits, CPU 0 in the low bit of the first.
std::string cpu_mask_hex() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) {
    const long n = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
    for (long c = 0; c < n && c < CPU_SETSIZE; ++c) CPU_SET(static_cast<int>(c), &set);
  }
  std::string hex;
  for (int c = 0; c < CPU_SETSIZE; c += 4) {
    int d = 0;
    for (int k = 0; k < 4; ++k) d |= CPU_ISSET(c + k, &set) ? 1 << k : 0;
    hex += "0123456789abcdef"[d];
  }
  while (hex.size() > 1 && hex.back() == '0') hex.pop_back();
  return hex;
}

bool add_cpu_mask(const std::string& hex, std::vector<bool>& cpus) {
  if (hex.empty() || hex.size() > CPU_SETSIZE / 4) return false;
  if (cpus.size() < 4 * hex.size()) cpus.resize(4 * hex.size(), false);
  for (size_t i = 0; i < hex.size(); ++i) {
    const char ch = hex[i];
    const int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    if (d < 0) return false;
    for (int k = 0; k < 4; ++k)
      if (d & (1 << k)) cpus[4 * i + static_cast<size_t>(k)] = true;
  }
  return true;
}

HostIdentity this_host() {
  HostIdentity h;
  std::string boot = read_line("/proc/sys/kernel/random/boot_id");
  if (boot.empty()) boot = "no-boot-id";
  // No spaces: the store value is "KEY CPUS NAME".
  h.key = boot + "/" + ns_id("pid") + "/" + ns_id("mnt") + "/" + ns_id("ipc");
  // Tests split one machine into several "hosts" with it. Appending can only
  // tell processes apart, never make two hosts look alike.
  if (const char* s = std::getenv("TESSERA_HOST_KEY_SUFFIX"); s && *s) {
    std::string suffix(s);
    for (char& c : suffix)
      if (c == ' ') c = '_';
    h.key += "/" + suffix;
  }
  char name[256] = {0};
  if (const char* n = std::getenv("TESSERA_HOST_NAME"); n && *n)
    h.name = n;
  else if (::gethostname(name, sizeof name - 1) == 0)
    h.name = name;
  else
    h.name = "?";
  h.cpus = cpu_mask_hex();
  return h;
}

std::vector<int> HostMap::ranks_on(int h) const {
  std::vector<int> r;
  for (int i = 0; i < static_cast<int>(host_of.size()); ++i)
    if (host_of[i] == h) r.push_back(i);
  return r;
}

bool HostMap::crowded(int h) const {
  return h >= 0 && h < static_cast<int>(cpus.size()) &&
         static_cast<int>(ranks_on(h).size()) > cpus[static_cast<size_t>(h)];
}

bool HostMap::crowded() const {
  for (int h = 0; h < num_hosts(); ++h)
    if (crowded(h)) return true;
  return false;
}

std::string HostMap::describe(int r) const {
  if (r < 0 || r >= static_cast<int>(host_of.size())) return "an unknown host";
  return "host '" + names[host_of[r]] + "'";
}

HostMap exchange_hosts(Store& store, int rank, int size, std::chrono::milliseconds timeout) {
  const HostIdentity me = this_host();
  // "KEY CPUS NAME": the key and the mask have no spaces; the name may.
  const std::string mine = me.key + " " + me.cpus + " " + me.name;
  store.set("host/" + std::to_string(rank), mine);
  // One deadline for all peers; on timeout, name the ranks that never came.
  std::vector<std::string> keys;
  keys.reserve(size);
  for (int j = 0; j < size; ++j) keys.push_back("host/" + std::to_string(j));
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError& e) {
    std::string missing;
    int n = 0;
    for (int j = 0; j < size; ++j) {
      try {
        store.get(keys[j], std::chrono::milliseconds(1));
      } catch (const TimeoutError&) {
        missing += (n++ ? ", " : "") + std::to_string(j);
      }
    }
    throw TimeoutError(detail::concat(n == 1 ? "rank " : "ranks ", missing.empty() ? "?" : missing,
                                      n == 1 ? " never published its" : " never published their",
                                      " host identity within ", timeout.count(), " ms (", e.what(), ")"));
  }
  HostMap m;
  m.host_of.resize(size);
  std::map<std::string, int> index;
  std::vector<std::vector<bool>> masks;  // host index -> union of its ranks' CPUs
  for (int j = 0; j < size; ++j) {
    const std::string v = j == rank ? mine : store.get(keys[j], timeout);
    const auto sp = v.find(' ');
    const auto sp2 = sp == std::string::npos ? sp : v.find(' ', sp + 1);
    TESSERA_ARG_CHECK(sp != 0 && sp2 != std::string::npos && sp2 + 1 < v.size(), "bad host identity '", v,
                      "' from rank ", j, " (expected 'KEY CPUS NAME')");
    auto [it, fresh] = index.emplace(v.substr(0, sp), static_cast<int>(m.names.size()));
    if (fresh) {
      m.names.push_back(v.substr(sp2 + 1));
      masks.emplace_back();
    }
    m.host_of[j] = it->second;
    const std::string cpus = v.substr(sp + 1, sp2 - sp - 1);
    std::vector<bool> its;
    TESSERA_ARG_CHECK(add_cpu_mask(cpus, its) && std::count(its.begin(), its.end(), true) > 0, "bad CPU mask '", cpus,
                      "' in the host identity of rank ", j, " (hex digits, at least one CPU)");
    add_cpu_mask(cpus, masks[static_cast<size_t>(it->second)]);
  }
  for (const auto& mask : masks) m.cpus.push_back(static_cast<int>(std::count(mask.begin(), mask.end(), true)));
  return m;
}

}  // namespace tessera::collectives
