// Counter-based randomness: pure functions of their inputs, so every rank
// derives the same values without sharing generator state (initialisation
// that does not depend on the parallel layout, layout-independent batches).
#pragma once

#include <cstdint>

namespace tessera {

// SplitMix64 finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace tessera
