// How many elements of two equally laid out matrices differ in their bits: Gemm.cpp's algorithm
// tuning keeps only candidates that give the heuristic's own result bit for bit.
#include "runtime/kernels/cuda/Common.cuh"

namespace hcp::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;

// count += the elements of `batches` matrices [rows, cols] (row stride ld, batch stride stride,
// in elements of `Word`, the element's size) at which a and b differ.
template <typename Word>
__global__ void count_differences_kernel(unsigned long long* count, const Word* a, const Word* b,
                                         int64_t batches, int64_t stride, int64_t rows,
                                         int64_t cols, int64_t ld) {
  unsigned long long local = 0;
  const int64_t total = batches * rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t col = i % cols, row = (i / cols) % rows, batch = i / (cols * rows);
    const int64_t at = batch * stride + row * ld + col;
    local += a[at] != b[at] ? 1 : 0;
  }
  if (local != 0) atomicAdd(count, local);
}

}  // namespace

Status count_differences(cudaStream_t stream, unsigned long long* count, const void* a,
                         const void* b, int element_bytes, int64_t batches, int64_t stride,
                         int64_t rows, int64_t cols, int64_t ld) {
  const char* name = "count_differences";
  if (batches < 0 || rows < 0 || cols < 0) return Status(name, "negative size");
  if (cudaError_t e = cudaMemsetAsync(count, 0, sizeof(*count), stream); e != cudaSuccess) {
    return Status::Cuda(name, e);
  }
  const int64_t total = batches * rows * cols;
  if (total == 0) return Status();
  const unsigned grid = grid_for(total, kThreads);
  if (element_bytes == 4) {
    count_differences_kernel<<<grid, kThreads, 0, stream>>>(count, static_cast<const uint32_t*>(a),
                                                            static_cast<const uint32_t*>(b),
                                                            batches, stride, rows, cols, ld);
  } else if (element_bytes == 2) {
    count_differences_kernel<<<grid, kThreads, 0, stream>>>(count, static_cast<const uint16_t*>(a),
                                                            static_cast<const uint16_t*>(b),
                                                            batches, stride, rows, cols, ld);
  } else {
    return Status(name, "elements of 2 or 4 bytes");
  }
  return launch_status(name);
}

}  // namespace hcp::cuda
