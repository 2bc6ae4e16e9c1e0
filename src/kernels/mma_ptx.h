// The sm_80+ PTX that the tensor-core kernels share (gemm_mma.cu, attention_prefill_mma.cu,
// attention_decode_mma.cu, skinny_gemm.cu): cp.async copies into shared memory, ldmatrix,
// m16n8k16 mma (and sm_89's e4m3 m16n8k32) with fp32 accumulators, operand packing and a
// one-instruction exp2. Device code only; include from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace gpulab::kernels {

__device__ inline uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ inline void cp_async16(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem) : "memory");
}
// 16 bytes, or 16 zero bytes when !valid (gmem is then not read, but must still be a mapped address).
__device__ inline void cp_async16_or_zero(uint32_t smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Two floats rounded to T (bf16 or fp16), packed low-first as an mma operand register or a
// 4-byte store.
template <class T>
__device__ inline uint32_t pack2(float lo, float hi) {
  const T v[2] = {static_cast<T>(lo), static_cast<T>(hi)};
  uint32_t r;
  memcpy(&r, v, 4);
  return r;
}

// Elements per row of a [rows][D] tile of 16-bit values in shared memory: rows padded by 16
// bytes put the 8 row addresses of an ldmatrix (and of a cp.async wave) in 8 different bank groups.
template <int D>
constexpr int ldmatrix_pitch() {
  return D + 8;
}

// Volatile: the same address holds new data after a barrier (pipelined stages).
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a·b for one m16n8k16 tile: a 16×16 (row), b 16×8 (col), d 16×8 fp32; T is bf16 or fp16.
template <class T>
__device__ inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "mma.sync takes bf16 or fp16");
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a·b for one m16n8k32 tile of e4m3 (sm_89 and newer): a 16×32 (row), b 32×8 (col), d 16×8
// fp32. Each register holds 4 e4m3 where m16n8k16's holds 2 bf16, in the same fragment places.
__device__ inline void mma_16832_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if __CUDA_ARCH__ >= 890
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // the host refuses fp8 below compute capability 8.9
#endif
}

// 2^x in one MUFU instruction (about 2 ulp; results below 2^-126 flush to 0, 2^-inf is 0):
// exp2f's handling of denormal results costs several instructions per softmax weight.
__device__ inline float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace gpulab::kernels
