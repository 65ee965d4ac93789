#include "collectives/host.h"

#include <unistd.h>

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

HostIdentity this_host() {
  HostIdentity h;
  std::string boot = read_line("/proc/sys/kernel/random/boot_id");
  if (boot.empty()) boot = "no-boot-id";
  // No spaces: the store value is "KEY NAME".
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
  return h;
}

std::vector<int> HostMap::ranks_on(int h) const {
  std::vector<int> r;
  for (int i = 0; i < static_cast<int>(host_of.size()); ++i)
    if (host_of[i] == h) r.push_back(i);
  return r;
}

std::string HostMap::describe(int r) const {
  if (r < 0 || r >= static_cast<int>(host_of.size())) return "an unknown host";
  return "host '" + names[host_of[r]] + "'";
}

HostMap exchange_hosts(Store& store, int rank, int size, std::chrono::milliseconds timeout) {
  const HostIdentity me = this_host();
  store.set("host/" + std::to_string(rank), me.key + " " + me.name);
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
  for (int j = 0; j < size; ++j) {
    std::string v = j == rank ? me.key + " " + me.name : store.get(keys[j], timeout);
    const auto sp = v.find(' ');
    TESSERA_CHECK(sp != std::string::npos, "bad host identity '", v, "' from rank ", j);
    auto [it, fresh] = index.emplace(v.substr(0, sp), static_cast<int>(m.names.size()));
    if (fresh) m.names.push_back(v.substr(sp + 1));
    m.host_of[j] = it->second;
  }
  return m;
}

}  // namespace tessera::collectives
