// gpulab bench launch: what one kernel launch costs, three ways.
#include <chrono>

#include "bench/suite.h"
#include "bench/timing.h"
#include "core/memory.h"
#include "kernels/membench.h"

namespace gpulab::bench {

namespace {

void launch_empty(cudaStream_t s) {
  GPULAB_CHECK(cudaLaunchKernel(kernels::empty_kernel_function(), dim3(1), dim3(1), nullptr, 0, s));
}

}  // namespace

void run_launch_suite(Context& ctx) {
  core::Stream stream;
  const int samples = ctx.quick() ? 10 : 30;
  constexpr int kBatch = 1000;
  auto us = [](std::vector<double> ms, double per) {
    for (auto& v : ms) v = v * 1000.0 / per;
    return summarize(ms);
  };
  // Back to back: host time to enqueue, and device time per kernel when the queue stays full.
  const auto host = time_on_host([&] { for (int i = 0; i < kBatch; ++i) launch_empty(stream); }, {samples, 1.0, 20.0});
  stream.synchronize();
  const auto device = time_on_stream(stream, [&] { for (int i = 0; i < kBatch; ++i) launch_empty(stream); }, {samples, 1.0, 20.0});
  // Round trip: launch, then wait for it.
  const auto trip = time_on_host([&] { launch_empty(stream); stream.synchronize(); }, {samples, 1.0, 20.0});
  // A graph of kBatch empty kernels in a chain, replayed.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GPULAB_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kBatch; ++i) launch_empty(stream);
  GPULAB_CHECK(cudaStreamEndCapture(stream, &graph));
  GPULAB_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<double> graph_ms;
  try {
    graph_ms = time_on_stream(stream, [&] { GPULAB_CHECK(cudaGraphLaunch(exec, stream)); }, {samples, 1.0, 20.0});
  } catch (...) {
    GPULAB_CHECK_NOTHROW(cudaGraphExecDestroy(exec));
    GPULAB_CHECK_NOTHROW(cudaGraphDestroy(graph));
    throw;
  }
  GPULAB_CHECK(cudaGraphExecDestroy(exec));
  GPULAB_CHECK(cudaGraphDestroy(graph));

  ctx.add(make_row("launch", "launch_host_enqueue", "latency", "us", us(host, kBatch), std::nullopt, {{"kernels_per_sample", kBatch}}));
  ctx.add(make_row("launch", "launch_back_to_back_device", "latency", "us", us(device, kBatch), std::nullopt, {{"kernels_per_sample", kBatch}}));
  ctx.add(make_row("launch", "launch_sync_round_trip", "latency", "us", us(trip, 1), std::nullopt));
  ctx.add(make_row("launch", "graph_per_node", "latency", "us", us(graph_ms, kBatch), std::nullopt, {{"graph_nodes", kBatch}}));
  ctx.finish("launch (empty kernels, 1 block of 1 thread)");
}

}  // namespace gpulab::bench
