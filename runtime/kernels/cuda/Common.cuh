// Shared by the kernel files (not part of the API): launch helpers, 8-element vector loads and
// stores, fp32 math helpers, warp and block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "runtime/kernels/cuda/Kernels.h"

namespace hcp::cuda::detail {

// ---------------------------------------------------------------------------------------------
// Host side.

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The status of the launch just made (and of any earlier asynchronous failure).
inline Status launch_status(const char* where) {
  cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? Status() : Status::Cuda(where, error);
}

// Multiprocessors of the current device, cached per device.
int sm_count();

// Blocks for a grid-stride loop over `items` with `threads` per block: enough to fill the chip
// several times over, never more than the items need.
inline unsigned grid_for(int64_t items, int threads) {
  const int64_t cap = int64_t{sm_count()} * 16;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(ceil_div(items, threads), cap)));
}

// Carves aligned pieces out of a Workspace, in order; reports whether it was large enough.
class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(Workspace ws) : base_(static_cast<char*>(ws.ptr)), bytes_(ws.bytes) {}
  template <typename T>
  T* take(int64_t count) {
    const size_t offset = used_;
    used_ = static_cast<size_t>(round_up(static_cast<int64_t>(used_ + sizeof(T) * count), 256));
    return base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + offset);
  }
  size_t used() const { return used_; }
  bool fits() const { return base_ != nullptr && used_ <= bytes_; }

 private:
  char* base_;
  size_t bytes_;
  size_t used_ = 0;
};

// Sums fp32 partials [chunks, cols] over the chunks, in order, into out [cols] (float or bf16).
template <typename T>
Status sum_partials(cudaStream_t stream, T* out, const float* partials, int64_t chunks,
                    int64_t cols);

// ---------------------------------------------------------------------------------------------
// Device side.

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Eight consecutive elements as fp32. The aligned forms need p 16-byte aligned (one 16-byte
// access for bf16, two for float); the masked forms read/write only the first `valid` elements.
__device__ __forceinline__ void load8(float (&v)[8], const __nv_bfloat16* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 f = __bfloat1622float2(pairs[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(float (&v)[8], const float* p) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&v)[8]) {
  uint4 raw;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; i++) pairs[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
template <typename T>
__device__ __forceinline__ void load8_masked(float (&v)[8], const T* p, int valid, float fill) {
#pragma unroll
  for (int i = 0; i < 8; i++) v[i] = i < valid ? to_float(p[i]) : fill;
}
template <typename T>
__device__ __forceinline__ void store8_masked(T* p, const float (&v)[8], int valid) {
#pragma unroll
  for (int i = 0; i < 8; i++) {
    if (i < valid) p[i] = from_float<T>(v[i]);
  }
}
// The vector form when allowed (`vec`: the caller checked alignment) and all 8 are valid.
template <typename T>
__device__ __forceinline__ void load8_any(float (&v)[8], const T* p, int valid, bool vec,
                                          float fill = 0.f) {
  if (vec && valid == 8) {
    load8(v, p);
  } else {
    load8_masked(v, p, valid, fill);
  }
}
template <typename T>
__device__ __forceinline__ void store8_any(T* p, const float (&v)[8], int valid, bool vec) {
  if (vec && valid == 8) {
    store8(p, v);
  } else {
    store8_masked(p, v, valid);
  }
}

// fp32 math shared with the CPU oracle's formulas.
// x as a bf16 store and load would give it back (round to nearest even).
__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }
// d/dx [x sigmoid(x)] = s (1 + x (1 - s)).
__device__ __forceinline__ float silu_grad(float x) {
  const float s = sigmoidf(x);
  return s * (1.f + x * (1.f - s));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block, returned to every thread. `scratch` holds 32 values; consecutive calls may
// reuse it (the leading barrier keeps the previous call's readers ahead of the next writers).
template <typename V>
__device__ __forceinline__ V block_sum(V v, V* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  V total = lane < warps ? scratch[lane] : V(0);
  return warp_sum(total);
}

}  // namespace hcp::cuda::detail
