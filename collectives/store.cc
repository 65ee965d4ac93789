#include "collectives/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "runtime/error.h"
#include "runtime/files.h"

namespace tessera::collectives {

namespace {

std::string missing_list(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", " : "") + ("'" + keys[i] + "'");
  if (keys.size() > 8) s += ", ... (" + std::to_string(keys.size()) + " in all)";
  return s;
}

// One file per key. Keys may hold any byte; file names escape everything
// but [A-Za-z0-9._-] as %XX so '/' in keys cannot escape the directory.
class FileStore : public Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {
    TESSERA_ARG_CHECK(!dir_.empty(), "file store directory is empty");
    if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST)
      throw InvalidArgument("cannot create file store directory '" + dir_ + "': " + std::strerror(errno));
    struct stat st {};
    if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw InvalidArgument("file store path '" + dir_ + "' is not a directory");
  }

  void set(const std::string& key, const std::string& value) override { write_atomic(path(key), value); }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    std::string v;
    if (!read(path(key), &v)) throw InternalError("file store key '" + key + "' vanished in " + dir_);
    return v;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<std::string> missing = keys;
    auto sleep = std::chrono::microseconds(200);
    for (;;) {
      missing.erase(std::remove_if(missing.begin(), missing.end(),
                                   [&](const std::string& k) { return ::access(path(k).c_str(), F_OK) == 0; }),
                    missing.end());
      if (missing.empty()) return;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        throw TimeoutError("file store " + dir_ + ": timed out after " + std::to_string(timeout.count()) +
                           " ms waiting for " + missing_list(missing));
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(sleep, deadline - now));
      sleep = std::min(sleep * 2, std::chrono::microseconds(20000));
    }
  }

  int64_t add(const std::string& key, int64_t delta) override {
    // A directory-wide flock serialises read-modify-write across processes;
    // the mutex does so across threads (flock is per open file description).
    std::lock_guard<std::mutex> lk(mu_);
    const std::string lock_path = dir_ + "/.lock";
    int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) throw Error("file store: cannot open " + lock_path + ": " + std::strerror(errno));
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno != EINTR) {
        ::close(fd);
        throw Error("file store: flock " + lock_path + ": " + std::strerror(errno));
      }
    }
    int64_t v = 0;
    std::string cur;
    if (read(path(key), &cur)) {
      try {
        v = std::stoll(cur);
      } catch (const std::exception&) {
        ::flock(fd, LOCK_UN);
        ::close(fd);
        throw FormatError("file store key '" + key + "' in " + dir_ + " holds '" + cur + "', not an integer");
      }
    }
    v += delta;
    try {
      write_atomic(path(key), std::to_string(v));
    } catch (...) {
      ::flock(fd, LOCK_UN);
      ::close(fd);
      throw;
    }
    ::flock(fd, LOCK_UN);
    ::close(fd);
    return v;
  }

 private:
  std::string path(const std::string& key) const {
    static const char* hex = "0123456789ABCDEF";
    std::string p = dir_ + "/k_";
    for (unsigned char c : key) {
      if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
        p += static_cast<char>(c);
      } else {
        p += '%';
        p += hex[c >> 4];
        p += hex[c & 15];
      }
    }
    return p;
  }

  // Key files are private to the job's user, like the directory. They live
  // as long as the job, so they are not fsynced (AtomicWriteOptions::sync).
  static void write_atomic(const std::string& p, const std::string& value) {
    AtomicWriteOptions o;
    o.mode = 0600;
    o.sync = false;
    write_file_atomic(p, value, o);
  }

  static bool read(const std::string& p, std::string* out) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    out->clear();
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      out->append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return true;
  }

  std::string dir_;
  std::mutex mu_;
};

class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      map_[key] = value;
    }
    cv_.notify_all();
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lk(mu_);
    wait_locked(lk, {key}, timeout);
    return map_.at(key);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lk(mu_);
    wait_locked(lk, keys, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t v = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) {
        try {
          v = std::stoll(it->second);
        } catch (const std::exception&) {
          throw FormatError("memory store key '" + key + "' holds '" + it->second + "', not an integer");
        }
      }
      v += delta;
      map_[key] = std::to_string(v);
    }
    cv_.notify_all();
    return v;
  }

 private:
  void wait_locked(std::unique_lock<std::mutex>& lk, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout) {
    auto all_there = [&] {
      return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return map_.count(k) != 0; });
    };
    if (!cv_.wait_for(lk, timeout, all_there)) {
      std::vector<std::string> missing;
      for (const auto& k : keys)
        if (!map_.count(k)) missing.push_back(k);
      throw TimeoutError("memory store: timed out after " + std::to_string(timeout.count()) + " ms waiting for " +
                         missing_list(missing));
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> map_;
};

}  // namespace

std::shared_ptr<Store> make_file_store(const std::string& directory) { return std::make_shared<FileStore>(directory); }
std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>(); }

}  // namespace tessera::collectives
