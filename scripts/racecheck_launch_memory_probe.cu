// How much host memory does compute-sanitizer's racecheck hold for launches the host has not yet
// synchronised with? The training and 7B engine tests under racecheck took 26-125 GiB of host
// memory (sessions 36-40). This probe launches a tiny kernel LAUNCHES times, waiting for the GPU
// every SYNC_EVERY launches (0: once, at the end) with cudaDeviceSynchronize (`device`) or
// cudaStreamSynchronize on its stream (`stream`), with BLOCKS_PER_SM blocks a SM (default 2), and
// prints its own resident memory every 250 launches (10 of `gemm`). `graph` runs the kernels 50 at
// a time as one CUDA graph replayed (stream waits; SYNC_EVERY a multiple of 50), as
// `gpulab train --cuda-graph` replays a training step.
// Build and run on an sm_90 GPU:
//   nvcc -O2 -arch=sm_90 -o probe scripts/racecheck_launch_memory_probe.cu -lcublas
//   compute-sanitizer --tool racecheck ./probe 3000 0        # session 41: 31.5 GiB
//   compute-sanitizer --tool racecheck ./probe 3000 100      # session 41: 1.9 GiB, flat
//   compute-sanitizer --tool racecheck ./probe 1500 100 stream  # session 41: as flat as `device`
// Session 41 also found CUDA_LAUNCH_BLOCKING=1 no help (32.7 GiB with SYNC_EVERY 0): the launches
// finish one by one, but the tool holds each until the host waits for the GPU. Not yet run:
// whether what a launch holds grows with its grid (BLOCKS_PER_SM 2 against 64), and whether a
// graph's kernels are held as launches are (`3000 0 graph` against `3000 0 stream`).
// KERNEL `race` launches instead a kernel whose warps read each other's shared memory without a
// barrier, so that racecheck reports hazards in every block: session 42 saw the 7B-shape runs grow
// by about 1 GiB/s while waiting at every layer, all their reports in cuBLASLt's kernels. Does
// what the tool holds grow with the hazards it finds (`3000 100 stream 2 race` against `... axpy`)?
// And does the tool's own `--force-synchronization-limit 100` bound it as the waits do
// (`compute-sanitizer --tool racecheck --force-synchronization-limit 100 ./probe 3000 0`)?
// KERNEL `gemm` launches a bf16 GEMM of 4096³ through cuBLAS instead (cuBLASLt's `nvjet` kernels on
// Hopper; link with -lcublas), the kind of launch session 42 measured at over 1 GiB each; wait
// `event` waits with cudaEventSynchronize on an event recorded on the stream, as cuBLASLt
// autotuning's timer does (blas/matmul.cpp).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

void check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "%s failed: %s\n", call, cudaGetErrorString(status));
  std::exit(1);
}
#define CHECK(x) check((x), #x)

__global__ void axpy(int n, float a, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

// A deliberate read-after-write hazard: each thread reads what a thread of another warp wrote,
// with no barrier between (blocks of 256 threads).
__global__ void race(int n, const float* x, float* y) {
  __shared__ float staged[256];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  staged[threadIdx.x] = i < n ? x[i] : 0.f;
  if (i < n) y[i] += staged[(threadIdx.x + 32) % 256];
}

long resident_mib() {
  FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmRSS: %ld", &kib) == 1) break;
  if (f) std::fclose(f);
  return kib / 1024;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s LAUNCHES SYNC_EVERY [device|stream|event|graph] [BLOCKS_PER_SM] [axpy|race|gemm]\n",
                 argv[0]);
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run a timeout ends still shows how far it got
  const int launches = std::atoi(argv[1]), sync_every = std::atoi(argv[2]);
  const bool graph = argc > 3 && std::strcmp(argv[3], "graph") == 0;
  const bool stream_sync = graph || (argc > 3 && std::strcmp(argv[3], "stream") == 0);
  const bool event_sync = argc > 3 && std::strcmp(argv[3], "event") == 0;
  const int blocks_per_sm = argc > 4 ? std::atoi(argv[4]) : 2;
  const char* kernel = argc > 5 ? argv[5] : "axpy";
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = blocks_per_sm * sms, n = blocks * 256;
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  float *x, *y;
  CHECK(cudaMalloc(&x, n * sizeof(float)));
  CHECK(cudaMalloc(&y, n * sizeof(float)));
  CHECK(cudaMemset(x, 0, n * sizeof(float)));
  CHECK(cudaMemset(y, 0, n * sizeof(float)));
  cudaEvent_t done;
  CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  constexpr int kGemmSize = 4096;
  cublasHandle_t blas = nullptr;
  __nv_bfloat16* matrices = nullptr;  // A, B and C of the GEMM, zeros
  if (std::strcmp(kernel, "gemm") == 0) {
    const size_t bytes = 3ull * kGemmSize * kGemmSize * sizeof(__nv_bfloat16);
    CHECK(cudaMalloc(&matrices, bytes));
    CHECK(cudaMemset(matrices, 0, bytes));
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(blas, stream) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cuBLAS would not start\n");
      return 1;
    }
  }
  auto launch = [&] {
    if (blas) {
      const float one = 1.f, zero = 0.f;
      const size_t square = size_t(kGemmSize) * kGemmSize;
      if (cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, kGemmSize, kGemmSize, kGemmSize, &one, matrices, CUDA_R_16BF,
                       kGemmSize, matrices + square, CUDA_R_16BF, kGemmSize, &zero, matrices + 2 * square, CUDA_R_16BF,
                       kGemmSize, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasGemmEx failed\n");
        std::exit(1);
      }
    } else if (std::strcmp(kernel, "race") == 0) {
      race<<<blocks, 256, 0, stream>>>(n, x, y);
    } else {
      axpy<<<blocks, 256, 0, stream>>>(n, 1.0001f, x, y);
    }
  };
  auto wait = [&] {
    if (event_sync) {
      CHECK(cudaEventRecord(done, stream));
      CHECK(cudaEventSynchronize(done));
    } else {
      CHECK(stream_sync ? cudaStreamSynchronize(stream) : cudaDeviceSynchronize());
    }
  };
  constexpr int kGraphKernels = 50;
  cudaGraphExec_t replay = nullptr;
  if (graph) {
    cudaGraph_t captured;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kGraphKernels; ++i) launch();
    CHECK(cudaStreamEndCapture(stream, &captured));
    CHECK(cudaGraphInstantiate(&replay, captured, 0));
    CHECK(cudaGraphDestroy(captured));
  }
  CHECK(cudaDeviceSynchronize());
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::printf("start: resident %ld MiB\n", resident_mib());
  const int step = graph ? kGraphKernels : 1;  // kernels a launch runs
  for (int i = step; i <= launches; i += step) {
    if (graph) {
      CHECK(cudaGraphLaunch(replay, stream));
    } else {
      launch();
      CHECK(cudaGetLastError());
    }
    if (sync_every && i % sync_every == 0) wait();
    if (i % (blas ? 10 : 250) == 0) std::printf("%d launches, %.1f s: resident %ld MiB\n", i, seconds(), resident_mib());
  }
  CHECK(cudaDeviceSynchronize());
  std::printf("synchronised, %.1f s: resident %ld MiB\n", seconds(), resident_mib());
  if (blas) cublasDestroy(blas);
  return 0;
}
