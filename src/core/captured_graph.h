// A CUDA graph captured from the work a callable enqueues on one stream, then replayed with one
// launch: the training step's ~3,000 launches cost the host one call (`gpulab train --cuda-graph`),
// and so do the LLM engine's decode steps. The captured work must use fixed buffers and take
// nothing from the host that changes between replays; capture does not run it.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

namespace gpulab::core {

class CapturedGraph {
 public:
  CapturedGraph() = default;
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  // Records what `enqueue` puts on `stream` (work already queued there runs as usual). Capture is
  // thread-local: this thread must not call a synchronizing CUDA API meanwhile (an error names it).
  void capture(cudaStream_t stream, const std::function<void()>& enqueue);
  void launch(cudaStream_t stream) const;
  bool captured() const { return exec_ != nullptr; }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace gpulab::core
