#include "data/shard.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "data/sampling.h"

namespace gpulab::data {

int64_t shard_batches_per_epoch(int64_t samples, int batch, int world) {
  if (batch < 1 || world < 1) throw core::InputError("sharding needs a positive batch and world size");
  return std::max<int64_t>(1, samples / (int64_t(batch) * world));
}

int64_t shard_position(int64_t local, int slot, int batch, Shard shard) {
  if (shard.rank < 0 || shard.rank >= shard.world)
    throw core::InputError("rank " + std::to_string(shard.rank) + " is outside a world of " + std::to_string(shard.world));
  return (local * shard.world + shard.rank) * batch + slot;
}

std::vector<int64_t> shard_samples(int64_t samples, int batch, Shard shard, uint64_t seed, int64_t epoch) {
  const std::vector<int64_t> order = epoch_order(samples, seed, epoch, true);
  const int64_t batches = shard_batches_per_epoch(samples, batch, shard.world);
  std::vector<int64_t> out;
  out.reserve(size_t(batches) * size_t(batch));
  for (int64_t b = 0; b < batches; ++b)
    for (int s = 0; s < batch; ++s) out.push_back(order[size_t(shard_position(b, s, batch, shard) % samples)]);
  return out;
}

}  // namespace gpulab::data
