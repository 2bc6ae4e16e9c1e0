// Which samples each rank of a data-parallel job reads. An epoch is one seeded shuffle of the
// dataset cut into global batches; rank r of `world` takes global batches r, r + world,
// r + 2·world, … so the ranks' shards are disjoint, and world ranks of batch B read exactly what
// one process reads with batch B and world micro-batches of gradient accumulation. The epoch's
// order is data/sampling.h's epoch_order, the same on every rank.
#pragma once

#include <cstdint>
#include <vector>

namespace gpulab::data {

struct Shard {
  int rank = 0;
  int world = 1;
};

// Batches one rank takes per epoch: full global batches only (floor), at least one (a dataset
// smaller than one global batch wraps around).
int64_t shard_batches_per_epoch(int64_t samples, int batch, int world);

// The position in epoch_order of sample `slot` of the rank's `local`-th batch of an epoch.
int64_t shard_position(int64_t local, int slot, int batch, Shard shard);

// Every sample index the rank reads in `epoch`, in the order it reads them (positions past the
// end of the order wrap to its start).
std::vector<int64_t> shard_samples(int64_t samples, int batch, Shard shard, uint64_t seed, int64_t epoch);

}  // namespace gpulab::data
