#include "core/captured_graph.h"

#include <string>

#include "core/error.h"
#include "core/sanitizer.h"

namespace gpulab::core {

CapturedGraph::~CapturedGraph() {
  if (exec_) GPULAB_CHECK_NOTHROW(cudaGraphExecDestroy(exec_));
}

void CapturedGraph::capture(cudaStream_t stream, const std::function<void()>& enqueue) {
  if (exec_) GPULAB_CHECK(cudaGraphExecDestroy(exec_));
  exec_ = nullptr;
  cudaGraph_t graph = nullptr;
  GPULAB_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (const std::exception& e) {
    cudaStreamEndCapture(stream, &graph);  // ends the (invalidated) capture; its error is the one above
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // so that the next launch check does not report the capture's error
    throw core::Error(std::string("CUDA graph capture failed: ") + e.what());
  }
  GPULAB_CHECK(cudaStreamEndCapture(stream, &graph));
  const cudaError_t status = cudaGraphInstantiate(&exec_, graph, 0);
  GPULAB_CHECK(cudaGraphDestroy(graph));
  if (status != cudaSuccess) exec_ = nullptr;
  GPULAB_CHECK(status);
  GPULAB_CHECK(cudaGraphUpload(exec_, stream));  // the first replay then costs what the others do
}

void CapturedGraph::launch(cudaStream_t stream) const {
  GPULAB_CHECK(cudaGraphLaunch(exec_, stream));
  // A training step's graph is ~3,000 kernels: if racecheck holds them as it holds launches (not
  // yet measured, scripts/racecheck_launch_memory_probe.cu's `graph`), one replay at a time.
  wait_under_racecheck(stream);
}

}  // namespace gpulab::core
