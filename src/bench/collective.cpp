#include "bench/collective.h"

#include "core/error.h"

namespace gpulab::bench {

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::all_gather: return "all_gather";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::broadcast: return "broadcast";
  }
  return "?";
}

double busbw_factor(Collective c, int ranks) {
  if (ranks < 1) throw core::Error("a collective needs at least one rank");
  const double n = ranks;
  switch (c) {
    case Collective::all_reduce: return 2 * (n - 1) / n;
    case Collective::all_gather:
    case Collective::reduce_scatter: return (n - 1) / n;
    case Collective::broadcast: return ranks == 1 ? 0.0 : 1.0;
  }
  return 0;
}

size_t send_count(Collective c, size_t bytes, size_t elem_bytes, int ranks) {
  const size_t elems = bytes / elem_bytes;
  switch (c) {
    case Collective::all_reduce:
    case Collective::broadcast: return elems;
    case Collective::all_gather: return elems / ranks;                    // size = receive buffer
    case Collective::reduce_scatter: return elems / ranks * ranks;        // size = send buffer
  }
  return 0;
}

size_t recv_count(Collective c, size_t send_count, int ranks) {
  switch (c) {
    case Collective::all_reduce:
    case Collective::broadcast: return send_count;
    case Collective::all_gather: return send_count * ranks;
    case Collective::reduce_scatter: return send_count / ranks;
  }
  return 0;
}

}  // namespace gpulab::bench
