// NCCL collectives as nccl-tests counts them: the bytes a run moves and the factor that turns
// algorithm bandwidth (size / time) into bus bandwidth, comparable with the link's peak.
#pragma once

#include <cstddef>
#include <string_view>

namespace gpulab::bench {

enum class Collective { all_reduce, all_gather, reduce_scatter, broadcast };

inline constexpr Collective kCollectives[] = {Collective::all_reduce, Collective::all_gather,
                                              Collective::reduce_scatter, Collective::broadcast};

std::string_view collective_name(Collective c);  // "all_reduce"
// all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1 (0 for n == 1 except
// broadcast's 1: one rank moves nothing over a bus).
double busbw_factor(Collective c, int ranks);
// Elements each rank sends for a run whose size (nccl-tests' "size": the larger of the send and
// receive buffers) is `bytes`, of elements of `elem_bytes`; rounded down to whole per-rank pieces.
size_t send_count(Collective c, size_t bytes, size_t elem_bytes, int ranks);
// Elements each rank receives for that send count.
size_t recv_count(Collective c, size_t send_count, int ranks);

}  // namespace gpulab::bench
