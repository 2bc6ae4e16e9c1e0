// A small, portable random generator (splitmix64) for everything in data/ that must repeat
// bit for bit across platforms and thread counts: std:: distributions are implementation-defined.
#pragma once

#include <cstdint>

namespace gpulab::data {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  // Independent stream for item `index` of run `seed` (e.g. one image of one epoch).
  static Rng for_item(uint64_t seed, uint64_t stream, uint64_t index) {
    Rng r(seed ^ (0x9E3779B97F4A7C15ull * (stream + 1)));
    r.state_ ^= r.next() + index * 0xD1B54A32D192ED03ull;
    return r;
  }
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Integer in [lo, hi), as torch.randint(lo, hi).
  int64_t randint(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo)); }

 private:
  uint64_t state_;
};

}  // namespace gpulab::data
