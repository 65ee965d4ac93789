// Editing a checkpoint's manifest as a careless or hostile user would, with
// the done marker re-hashed so that the checks after the marker's are what
// a test reaches.
#pragma once

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/files.h"
#include "tests/checkpoint/test_util.h"

namespace tessera::testing {

// DIR/done holding the SHA-256 of DIR/manifest.json as it is now (and its step).
inline void rehash_marker(const std::string& dir) {
  const std::string text = read_bytes(dir + "/manifest.json");
  // A manifest that is not JSON (a test of the parse behind the hash check) gets step 0.
  const nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const int64_t step = m.is_object() ? m.value("step", int64_t{0}) : 0;
  const nlohmann::json marker = {{"manifest_sha256", sha256_hex(text)}, {"step", step}};
  write_bytes(dir + "/done", marker.dump() + "\n");
}

// Applies `edit` to DIR/manifest.json and re-hashes the marker.
inline void edit_manifest_rehashed(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json m = nlohmann::json::parse(read_bytes(dir + "/manifest.json"));
  edit(m);
  write_bytes(dir + "/manifest.json", m.dump(1));
  rehash_marker(dir);
}

}  // namespace tessera::testing
