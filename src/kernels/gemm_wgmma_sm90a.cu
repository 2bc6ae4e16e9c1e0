// GEMM ladder step 5: Hopper warpgroup MMA (wgmma, sm_90a) fed by the tensor memory accelerator.
// bf16 in, fp32 accumulate and out. A is m×k row-major; B is stored n×k (each column of the
// mathematical k×n B contiguous), so both operands are K-major, the layout wgmma reads from
// shared memory without transposition (a linear layer's x·Wᵀ with W stored [out, in]).
//
// One block computes a 128×256 tile of C with three warpgroups: warpgroup 0 is the producer (one
// thread issues TMA copies of 128×64 A and 256×64 B tiles, 128-byte swizzled, into a 4-stage
// ring); warpgroups 1 and 2 each own 64 rows and issue m64n256k16 wgmma on the staged tiles.
// Full/empty mbarriers hand the stages back and forth.
//
// Built for sm_90a only (the _sm90a suffix; see src/kernels/CMakeLists.txt).
#include <cuda_bf16.h>

#include "core/error.h"
#include "kernels/gemm_ladder.h"
#include "kernels/tensor_map.h"
#include "kernels/wgmma_sm90a.cuh"

namespace gpulab::kernels {

namespace {

constexpr int kBm = 128, kBn = 256, kBk = 64, kStages = 4;
constexpr int kConsumers = 2, kThreads = 128 * (kConsumers + 1);
constexpr int kATileBytes = kBm * kBk * 2, kBTileBytes = kBn * kBk * 2;
constexpr int kStageBytes = kATileBytes + kBTileBytes;
constexpr size_t kSmemBytes = size_t(kStages) * kStageBytes + 1024;  // +1024: alignment slack
static_assert(kBk * 2 == 128, "a tile row is one 128-byte swizzle span");
static_assert(kBm == 64 * kConsumers, "each consumer warpgroup owns 64 rows");

// d[128] += A(64×16, desc_a) · B(16×256, desc_b)ᵀ-stored; fp32 accumulators in the wgmma fragment order.
__device__ inline void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"  // scale-d: accumulate into d
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(1));
#endif
}

__global__ void __launch_bounds__(kThreads, 1)
    wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b, float* __restrict__ c,
                 int m, int n, int k) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages];
  // 128-byte swizzled tiles must start on 1024-byte boundaries.
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  auto tile_a = [&](int s) { return smem + size_t(s) * kStageBytes; };
  auto tile_b = [&](int s) { return smem + size_t(s) * kStageBytes + kATileBytes; };

  const int warpgroup = threadIdx.x / 128, t = threadIdx.x % 128;
  const int row0 = blockIdx.y * kBm, col0 = blockIdx.x * kBn;
  const int k_tiles = k / kBk;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);                     // the producer's arrive (+ the TMA bytes)
      mbar_init(&empty[s], 128 * kConsumers);     // every consumer thread is done reading
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (warpgroup == 0) {
    if (t == 0) {
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % kStages;
        if (kt >= kStages) mbar_wait(&empty[s], ((kt / kStages) - 1) & 1);
        mbar_expect_tx(&full[s], kStageBytes);
        tma_load_2d(tile_a(s), &map_a, &full[s], kt * kBk, row0);
        tma_load_2d(tile_b(s), &map_b, &full[s], kt * kBk, col0);
      }
    }
  } else {
    const int wg = warpgroup - 1;  // rows wg*64 .. wg*64+63 of the block tile
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int s = kt % kStages;
      mbar_wait(&full[s], (kt / kStages) & 1);
      const unsigned char* a = tile_a(s) + wg * 64 * 128;  // 64 rows of 128 bytes
      const unsigned char* b = tile_b(s);
      wgmma_fence();
      fence_operands(acc);
#pragma unroll
      for (int kk = 0; kk < kBk / 16; ++kk)  // k16 steps advance 32 bytes inside the swizzled row
        wgmma_m64n256k16(acc, smem_descriptor(a + kk * 32), smem_descriptor(b + kk * 32));
      wgmma_commit();
      // One group stays in flight while the next stage is awaited; the one before it is done,
      // so its stage goes back to the producer.
      wgmma_wait<1>();
      fence_operands(acc);
      if (kt > 0) mbar_arrive(&empty[(kt - 1) % kStages]);
    }
    wgmma_wait<0>();
    fence_operands(acc);
    // Accumulator fragment: warp w of the warpgroup holds rows 16w..16w+15; per 8-column chunk j,
    // acc[4j], acc[4j+1] at (lane/4, 2·(lane%4)) and acc[4j+2], acc[4j+3] eight rows below.
    const int warp = t / 32, lane = t % 32;
    const int r = row0 + wg * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < kBn / 8; ++j) {
      const int col = col0 + j * 8 + (lane % 4) * 2;
      *reinterpret_cast<float2*>(c + size_t(r) * n + col) = make_float2(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<float2*>(c + size_t(r + 8) * n + col) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
#endif
}

}  // namespace

bool gemm_wgmma_compiled() { return true; }

void gemm_wgmma(const void* a, const void* b, float* c, int m, int n, int k, cudaStream_t stream) {
  const std::string rule = gemm_step_size_rule(GemmStep::wgmma, m, n, k);
  if (!rule.empty()) throw core::InputError(rule);
  if ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) % 16)
    throw core::InputError("gemm wgmma: A and B must be 16-byte aligned");
  const auto map = [&](const void* p, int rows, int box_rows) {
    return tensor_map_2d(p, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rows, k, box_rows, "gemm wgmma");
  };
  const CUtensorMap map_a = map(a, m, kBm), map_b = map(b, n, kBn);
  GPULAB_CHECK(cudaFuncSetAttribute(wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
  wgmma_kernel<<<dim3(n / kBn, m / kBm), kThreads, kSmemBytes, stream>>>(map_a, map_b, c, m, n, k);
  GPULAB_CHECK_LAUNCH();
}

}  // namespace gpulab::kernels
