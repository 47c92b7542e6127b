// Row-major matrix products through cuBLASLt (bf16 operands, fp32 accumulation, bf16 or fp32 C).
//
// cuBLASLt is column-major. A row-major [r, c] matrix with row stride ld is the column-major
// [c, r] matrix with the same ld, i.e. its transpose, so the row-major C = op(A) op(B) is computed
// as the column-major C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B, its "B" our A, M = n, N = m.
//
// The algorithm is chosen once per problem (transposes, sizes, strides, C type, whether beta is
// zero, alignments) and cached: the heuristic's first, or where the call can be run again with
// the same result (beta 0, or an addend other than C) the fastest of its first few that gives the
// first's bits (fastest_identical). A row-major leading dimension that varies
// from call to call (an MoE expert's token count: m when A is not transposed, k when A is
// transposed and B is not) is rounded up to a multiple of kBucket for the cache key and the
// heuristic query, so the experts' GEMMs share entries; should cuBLASLt refuse the bucket's
// algorithm for the exact shape, the exact shape is queried and used instead.
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "runtime/kernels/cuda/Kernels.h"

namespace hcp::cuda {
namespace {

constexpr int64_t kBucket = 64;
// The tuning times a family of buckets once: the experts' row counts change from step to step
// (another bucket most steps), and timing each bucket's candidates would cost more than it saves.
constexpr int64_t kTuningFamily = 512;

int64_t round_up_bucket(int64_t v) { return (v + kBucket - 1) / kBucket * kBucket; }
int64_t round_up_family(int64_t v) {
  return (v + kTuningFamily - 1) / kTuningFamily * kTuningFamily;
}

using GemmKey = std::array<int64_t, 15>;

// Strided batches: `count` products, the i-th on a + i * stride_a, b + i * stride_b and
// c + i * stride_c (elements). One product: count 1.
struct Batch {
  int64_t count = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

struct GemmKeyHash {
  size_t operator()(const GemmKey& key) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : key) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

template <typename TC>
constexpr cudaDataType_t c_type() {
  return std::is_same_v<TC, float> ? CUDA_R_32F : CUDA_R_16BF;
}

// The largest power of two <= 16 that divides both the address and the row stride in bytes.
int64_t alignment(const void* p, int64_t ld, int64_t element_bytes) {
  const uint64_t address = reinterpret_cast<uintptr_t>(p);
  const uint64_t stride = static_cast<uint64_t>(ld * element_bytes);
  int64_t align = 16;
  while (align > 1 && ((address | stride) % static_cast<uint64_t>(align)) != 0) align /= 2;
  return align;
}

Status lt_status(const char* where, cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? Status()
                                         : Status(where, cublasLtGetStatusString(status));
}

// Owns the cuBLASLt descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

void set_batch(cublasLtMatrixLayout_t layout, int64_t count, int64_t stride) {
  if (count == 1) return;
  const int32_t batch = static_cast<int32_t>(count);
  cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                   sizeof(batch));
  cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                   sizeof(stride));
}

// The column-major problem for row-major (m, n, k): layouts of cuBLASLt's A (our b), B (our a)
// and C.
Status make_layouts(Descriptors& d, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    int64_t lda, int64_t ldb, int64_t ldc, cudaDataType_t ctype,
                    const Batch& batch) {
  const char* where = "gemm: layout";
  if (Status s = lt_status(where, cublasLtMatrixLayoutCreate(&d.a, CUDA_R_16BF, trans_b ? k : n,
                                                             trans_b ? n : k, ldb));
      !s.ok()) {
    return s;
  }
  if (Status s = lt_status(where, cublasLtMatrixLayoutCreate(&d.b, CUDA_R_16BF, trans_a ? m : k,
                                                             trans_a ? k : m, lda));
      !s.ok()) {
    return s;
  }
  if (Status s = lt_status(where, cublasLtMatrixLayoutCreate(&d.c, ctype, n, m, ldc)); !s.ok()) {
    return s;
  }
  set_batch(d.a, batch.count, batch.stride_b);
  set_batch(d.b, batch.count, batch.stride_a);
  set_batch(d.c, batch.count, batch.stride_c);
  return Status();
}

}  // namespace

// A stream of gemm_group's, with its own cuBLASLt workspace (one workspace must not serve two
// launches at once) and the event that says its share is done.
struct GemmLane {
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  void* workspace = nullptr;
};

struct GemmContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::unordered_map<GemmKey, cublasLtMatmulAlgo_t, GemmKeyHash> algos;
  // The tuning's choice per family of problems (tuning_family): timed once for the family.
  std::unordered_map<GemmKey, cublasLtMatmulAlgo_t, GemmKeyHash> tuned;
  cudaEvent_t fork = nullptr;  // recorded on the caller's stream before the lanes start
  std::vector<GemmLane> lanes;
  int lane_sm_count = 0;  // each lane's share of the device's multiprocessors
  bool tune = true;       // time the heuristic's candidates on a problem's first call
};

void gemm_context_set_tuning(GemmContext* ctx, bool tune) {
  if (ctx != nullptr) ctx->tune = tune;
}

void gemm_context_destroy(GemmContext* ctx) {
  if (ctx == nullptr) return;
  for (GemmLane& lane : ctx->lanes) {
    if (lane.workspace != nullptr) cudaFree(lane.workspace);
    if (lane.done != nullptr) cudaEventDestroy(lane.done);
    if (lane.stream != nullptr) cudaStreamDestroy(lane.stream);
  }
  if (ctx->fork != nullptr) cudaEventDestroy(ctx->fork);
  if (ctx->workspace != nullptr) cudaFree(ctx->workspace);
  if (ctx->handle != nullptr) cublasLtDestroy(ctx->handle);
  delete ctx;
}

Status gemm_context_create(GemmContext** ctx, size_t workspace_bytes, int lanes) {
  const char* where = "gemm_context_create";
  *ctx = nullptr;
  auto* context = new GemmContext;
  context->workspace_bytes = workspace_bytes;
  auto fail = [context](Status s) {
    gemm_context_destroy(context);
    return s;
  };
  if (Status s = lt_status(where, cublasLtCreate(&context->handle)); !s.ok()) return fail(s);
  auto cuda = [where](cudaError_t error) {
    return error == cudaSuccess ? Status() : Status::Cuda(where, error);
  };
  if (workspace_bytes > 0) {
    if (Status s = cuda(cudaMalloc(&context->workspace, workspace_bytes)); !s.ok()) return fail(s);
  }
  context->lanes.resize(std::max(lanes, 0));
  if (lanes > 0) {
    if (Status s = cuda(cudaEventCreateWithFlags(&context->fork, cudaEventDisableTiming));
        !s.ok()) {
      return fail(s);
    }
    int device = 0, sms = 0;
    if (Status s = cuda(cudaGetDevice(&device)); !s.ok()) return fail(s);
    if (Status s = cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        !s.ok()) {
      return fail(s);
    }
    context->lane_sm_count = std::max(1, sms / lanes);
  }
  for (GemmLane& lane : context->lanes) {
    for (Status s :
         {cuda(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking)),
          cuda(cudaEventCreateWithFlags(&lane.done, cudaEventDisableTiming)),
          workspace_bytes > 0 ? cuda(cudaMalloc(&lane.workspace, workspace_bytes)) : Status()}) {
      if (!s.ok()) return fail(s);
    }
  }
  *ctx = context;
  return Status();
}

size_t gemm_context_bytes(size_t workspace_bytes, int lanes) {
  return workspace_bytes * (1 + static_cast<size_t>(std::max(lanes, 0)));
}

namespace {

// Where one product runs: the workspace it may use (the context's, or a lane's) and, for a lane,
// the multiprocessors cuBLASLt should plan for (0: the whole device). Hopper's cuBLASLt kernels
// size their grid to the SMs they are told of, so products running side by side each get a
// share instead of competing for all of them.
struct Target {
  void* workspace = nullptr;
  int sm_count = 0;
};

void set_sm_target(cublasLtMatmulDesc_t op, int sm_count) {
  if (sm_count <= 0) return;
  const int32_t target = sm_count;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof(target));
}

// The operation (fp32 accumulation, the transposes, the SM target) and the layouts of a problem:
// what the heuristic query and the launch both describe.
Status describe(Descriptors& d, const char* where, int sm_count, bool trans_a, bool trans_b,
                int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                cudaDataType_t ctype, const Batch& batch) {
  if (Status s = lt_status(where, cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      !s.ok()) {
    return s;
  }
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a));
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b));
  set_sm_target(d.op, sm_count);
  return make_layouts(d, trans_a, trans_b, m, n, k, lda, ldb, ldc, ctype, batch);
}

// The heuristic's best `wanted` algorithms (at least one) for the problem (m, n, k) with the
// given alignments, best first.
Status query_algos(GemmContext* ctx, int sm_count, bool trans_a, bool trans_b, int64_t m, int64_t n,
                   int64_t k, int64_t lda, int64_t ldb, int64_t ldc, cudaDataType_t ctype,
                   const Batch& batch, const int64_t (&align)[3], int wanted,
                   std::vector<cublasLtMatmulAlgo_t>* algos) {
  const char* where = "gemm: heuristic";
  Descriptors d;
  if (Status s =
          describe(d, where, sm_count, trans_a, trans_b, m, n, k, lda, ldb, ldc, ctype, batch);
      !s.ok()) {
    return s;
  }
  if (Status s = lt_status(where, cublasLtMatmulPreferenceCreate(&d.pref)); !s.ok()) return s;
  const uint64_t workspace = ctx->workspace_bytes;
  cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                       sizeof(workspace));
  // cuBLASLt's A is our b, its B our a; C and D are our c.
  const uint32_t align_a = static_cast<uint32_t>(align[1]);
  const uint32_t align_b = static_cast<uint32_t>(align[0]);
  const uint32_t align_c = static_cast<uint32_t>(align[2]);
  cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                       sizeof(align_a));
  cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                       sizeof(align_b));
  cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                       sizeof(align_c));
  cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                       sizeof(align_c));
  std::vector<cublasLtMatmulHeuristicResult_t> results(std::max(wanted, 1));
  std::memset(results.data(), 0, sizeof(results[0]) * results.size());
  int found = 0;
  if (Status s = lt_status(where, cublasLtMatmulAlgoGetHeuristic(
                                      ctx->handle, d.op, d.a, d.b, d.c, d.c, d.pref,
                                      static_cast<int>(results.size()), results.data(), &found));
      !s.ok()) {
    return s;
  }
  algos->clear();
  for (int i = 0; i < found; i++) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) algos->push_back(results[i].algo);
  }
  if (algos->empty()) return Status(where, "cuBLASLt has no algorithm for this problem");
  return Status();
}

Status query_algo(GemmContext* ctx, int sm_count, bool trans_a, bool trans_b, int64_t m, int64_t n,
                  int64_t k, int64_t lda, int64_t ldb, int64_t ldc, cudaDataType_t ctype,
                  const Batch& batch, const int64_t (&align)[3], cublasLtMatmulAlgo_t* algo) {
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (Status s = query_algos(ctx, sm_count, trans_a, trans_b, m, n, k, lda, ldb, ldc, ctype, batch,
                             align, 1, &algos);
      !s.ok()) {
    return s;
  }
  *algo = algos[0];
  return Status();
}

template <typename TC>
Status run(GemmContext* ctx, cudaStream_t stream, const Target& target, bool trans_a, bool trans_b,
           int64_t m, int64_t n, int64_t k, float alpha, const bf16* a, int64_t lda, const bf16* b,
           int64_t ldb, float beta, TC* c, int64_t ldc, const Batch& batch,
           const cublasLtMatmulAlgo_t& algo, const TC* addend) {
  const char* where = "gemm";
  Descriptors d;
  if (Status s = describe(d, where, target.sm_count, trans_a, trans_b, m, n, k, lda, ldb, ldc,
                          c_type<TC>(), batch);
      !s.ok()) {
    return s;
  }
  // cuBLASLt's C (read, times beta) is the addend when there is one, else c itself (its D).
  const TC* c_in = addend != nullptr ? addend : c;
  return lt_status(
      where, cublasLtMatmul(ctx->handle, d.op, &alpha, b, d.a, a, d.b, &beta, c_in, d.c, c, d.c,
                            &algo, target.workspace, ctx->workspace_bytes, stream));
}

// The heuristic's candidates a problem's first call times, and the most scratch (a second C)
// the timing may take.
constexpr int kTuneCandidates = 8;
constexpr size_t kTuneScratchBytes = size_t{512} << 20;

// A call the tuning runs again (its output into c or into scratch: beta 0, or an addend other
// than c, so that every run gives the same result), with the scratch it runs into and counts the
// differing elements in. prepare() is false while the stream is being captured into a graph or
// without the scratch: the tuning then keeps the heuristic's first.
template <typename TC>
struct TuningCall {
  GemmContext* ctx;
  cudaStream_t stream;
  Target target;
  bool trans_a, trans_b;
  int64_t m, n, k;
  float alpha;
  const bf16* a;
  int64_t lda;
  const bf16* b;
  int64_t ldb;
  float beta;
  int64_t ldc;
  Batch batch;
  const TC* addend;
  TC* scratch = nullptr;
  unsigned long long* count = nullptr;

  bool prepare() {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
      cudaGetLastError();  // a stream that cannot say: not tuned, not an error of the step's
      return false;
    }
    if (capture != cudaStreamCaptureStatusNone) return false;
    const int64_t extent = (batch.count - 1) * batch.stride_c + (m - 1) * ldc + n;
    const size_t c_bytes = (sizeof(TC) * extent + 255) / 256 * 256;
    void* p = nullptr;
    if (c_bytes > kTuneScratchBytes ||
        cudaMallocAsync(&p, c_bytes + sizeof(unsigned long long), stream) != cudaSuccess) {
      cudaGetLastError();  // out of memory: not an error of the step's
      return false;
    }
    scratch = static_cast<TC*>(p);
    count = reinterpret_cast<unsigned long long*>(static_cast<char*>(p) + c_bytes);
    return true;
  }
  ~TuningCall() {
    if (scratch == nullptr) return;
    cudaFreeAsync(scratch, stream);
    cudaGetLastError();  // a candidate that failed to launch leaves nothing for the step
  }
  Status run_into(TC* out, const cublasLtMatmulAlgo_t& algo) const {
    return run(ctx, stream, target, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, out,
               ldc, batch, algo, addend);
  }
  // Whether `out` and the scratch hold the same bits (waits for the stream).
  bool same_as_scratch(const TC* out) const {
    unsigned long long differ = 1;
    return count_differences(stream, count, out, scratch, sizeof(TC), batch.count, batch.stride_c,
                             m, n, ldc)
               .ok() &&
           cudaMemcpyAsync(&differ, count, sizeof(differ), cudaMemcpyDeviceToHost, stream) ==
               cudaSuccess &&
           cudaStreamSynchronize(stream) == cudaSuccess && differ == 0;
  }
};

// The fastest of `candidates` (the heuristic's, best first) among those that give the first's
// result bit for bit, timed on this call's operands (one run to warm up, then two), c left
// holding the first's result. cuBLASLt's first pick is not always its fastest: for tiny's experts'
// W_out product (K = 512) it took 223 us where its eighth took 151 us, with the same bits, on an
// H100.
template <typename TC>
cublasLtMatmulAlgo_t fastest_identical(TuningCall<TC>& call, TC* c,
                                       const std::vector<cublasLtMatmulAlgo_t>& candidates) {
  if (candidates.size() < 2 || !call.prepare()) return candidates[0];
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  // Milliseconds a run of `algo` into `out`; negative when it does not run.
  auto time = [&](const cublasLtMatmulAlgo_t& algo, TC* out) {
    if (!call.run_into(out, algo).ok()) return -1.f;
    cudaEventRecord(start, call.stream);
    for (int i = 0; i < 2; i++) call.run_into(out, algo);
    cudaEventRecord(stop, call.stream);
    float ms = -1.f;
    if (cudaEventSynchronize(stop) != cudaSuccess ||
        cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
      return -1.f;
    }
    return ms;
  };
  size_t best = 0;
  float best_ms = time(candidates[0], c);
  for (size_t i = 1; i < candidates.size() && best_ms >= 0.f; i++) {
    const float ms = time(candidates[i], call.scratch);
    if (ms >= 0.f && ms < best_ms && call.same_as_scratch(c)) {
      best = i;
      best_ms = ms;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return candidates[best];
}

// Whether `chosen` (the family's tuned algorithm) gives `first`'s result bit for bit on this
// call's operands: one run of each, c left holding first's result.
template <typename TC>
bool same_bits(TuningCall<TC>& call, TC* c, const cublasLtMatmulAlgo_t& first,
               const cublasLtMatmulAlgo_t& chosen) {
  if (std::memcmp(&first, &chosen, sizeof(first)) == 0) return true;
  return call.prepare() && call.run_into(c, first).ok() &&
         call.run_into(call.scratch, chosen).ok() && call.same_as_scratch(c);
}

// gemm() on `stream` at `target` (the context's own workspace, or a lane's). With an `addend`
// (same layout as c; beta 1, one product) c = alpha op(a) op(b) + addend instead.
template <typename TC>
Status gemm_with(GemmContext* ctx, cudaStream_t stream, const Target& target, bool trans_a,
                 bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const bf16* a,
                 int64_t lda, const bf16* b, int64_t ldb, float beta, TC* c, int64_t ldc,
                 const Batch& batch = Batch{}, const TC* addend = nullptr) {
  const char* where = "gemm";
  if (m < 0 || n < 0 || k < 0) return Status(where, "negative size");
  if (batch.count < 1 || batch.count > INT32_MAX) return Status(where, "bad batch count");
  if (lda < std::max<int64_t>(1, trans_a ? m : k) || ldb < std::max<int64_t>(1, trans_b ? k : n) ||
      ldc < std::max<int64_t>(1, n)) {
    return Status(where, "a row stride is smaller than its row");
  }
  if (m == 0 || n == 0) return Status();
  if (k == 0 && addend != nullptr && addend != c) {
    const cudaError_t error =
        cudaMemcpy2DAsync(c, sizeof(TC) * ldc, addend, sizeof(TC) * ldc, sizeof(TC) * n, m,
                          cudaMemcpyDeviceToDevice, stream);
    return error == cudaSuccess ? Status() : Status::Cuda(where, error);
  }
  if (k == 0) {
    if (beta == 1.f) return Status();
    if (beta != 0.f) return Status(where, "k == 0 with beta other than 0 or 1 is not supported");
    for (int64_t i = 0; i < batch.count; ++i) {
      cudaError_t error =
          cudaMemset2DAsync(c + i * batch.stride_c, sizeof(TC) * ldc, 0, sizeof(TC) * n, m, stream);
      if (error != cudaSuccess) return Status::Cuda(where, error);
    }
    return Status();
  }

  // A batch's strides count towards the alignment too: every product's start must have it.
  const int64_t align[3] = {alignment(a, std::gcd(lda, batch.stride_a), 2),
                            alignment(b, std::gcd(ldb, batch.stride_b), 2),
                            std::min(alignment(c, std::gcd(ldc, batch.stride_c), sizeof(TC)),
                                     alignment(addend != nullptr ? addend : c, ldc, sizeof(TC)))};
  const bool bucket_m = !trans_a;
  const bool bucket_k = trans_a && !trans_b;
  const int64_t m_key = bucket_m ? round_up_bucket(m) : m;
  const int64_t k_key = bucket_k ? round_up_bucket(k) : k;
  const GemmKey key = {trans_a,
                       trans_b,
                       m_key,
                       n,
                       k_key,
                       lda,
                       ldb,
                       ldc,
                       std::is_same_v<TC, float>,
                       beta != 0.f,
                       align[0],
                       align[1],
                       align[2],
                       target.sm_count,
                       batch.count};
  auto it = ctx->algos.find(key);
  if (it == ctx->algos.end()) {
    // Runs that give the same result every time: C not read, or an addend other than c.
    const bool tune = ctx->tune && (addend == nullptr ? beta == 0.f : addend != c);
    const int wanted = tune ? kTuneCandidates : 1;
    std::vector<cublasLtMatmulAlgo_t> candidates;
    if (Status s = query_algos(ctx, target.sm_count, trans_a, trans_b, m_key, n, k_key, lda, ldb,
                               ldc, c_type<TC>(), batch, align, wanted, &candidates);
        !s.ok()) {
      // The heuristic may have nothing for the bucket's shape yet something for the exact one.
      if (m_key == m && k_key == k) return s;
      if (Status exact = query_algos(ctx, target.sm_count, trans_a, trans_b, m, n, k, lda, ldb, ldc,
                                     c_type<TC>(), batch, align, wanted, &candidates);
          !exact.ok()) {
        return exact;
      }
    }
    cublasLtMatmulAlgo_t algo = candidates[0];
    if (tune) {
      // The family: the key with its varying dimension in a coarser bucket.
      GemmKey family = key;
      if (bucket_m) family[2] = round_up_family(m);
      if (bucket_k) family[4] = round_up_family(k);
      TuningCall<TC> call{ctx, stream, target, trans_a, trans_b, m,   n,     k,     alpha,
                          a,   lda,    b,      ldb,     beta,    ldc, batch, addend};
      if (auto f = ctx->tuned.find(family); f != ctx->tuned.end()) {
        if (same_bits(call, c, candidates[0], f->second)) algo = f->second;
      } else {
        algo = fastest_identical(call, c, candidates);
        ctx->tuned.emplace(family, algo);
      }
    }
    it = ctx->algos.emplace(key, algo).first;
  }
  Status status = run(ctx, stream, target, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta,
                      c, ldc, batch, it->second, addend);
  if (status.ok() || (m_key == m && k_key == k)) return status;
  // The cached algorithm came from the bucket's shape and does not run this one: use the exact
  // shape's own (not cached, to keep the bucket's entry for the shapes it serves).
  cublasLtMatmulAlgo_t exact;
  if (Status s = query_algo(ctx, target.sm_count, trans_a, trans_b, m, n, k, lda, ldb, ldc,
                            c_type<TC>(), batch, align, &exact);
      !s.ok()) {
    return s;
  }
  return run(ctx, stream, target, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
             batch, exact, addend);
}

}  // namespace

template <typename TC>
Status gemm(GemmContext* ctx, cudaStream_t stream, bool trans_a, bool trans_b, int64_t m, int64_t n,
            int64_t k, float alpha, const bf16* a, int64_t lda, const bf16* b, int64_t ldb,
            float beta, TC* c, int64_t ldc) {
  if (ctx == nullptr) return Status("gemm", "no GemmContext");
  return gemm_with(ctx, stream, Target{ctx->workspace, 0}, trans_a, trans_b, m, n, k, alpha, a, lda,
                   b, ldb, beta, c, ldc);
}

template <typename TC>
Status gemm_add(GemmContext* ctx, cudaStream_t stream, bool trans_a, bool trans_b, int64_t m,
                int64_t n, int64_t k, float alpha, const bf16* a, int64_t lda, const bf16* b,
                int64_t ldb, float beta, const TC* c, TC* out, int64_t ldc) {
  if (ctx == nullptr) return Status("gemm_add", "no GemmContext");
  return gemm_with(ctx, stream, Target{ctx->workspace, 0}, trans_a, trans_b, m, n, k, alpha, a, lda,
                   b, ldb, beta, out, ldc, Batch{}, c);
}

template <typename TC>
Status gemm_strided_batched(GemmContext* ctx, cudaStream_t stream, const GemmProblemOf<TC>& p,
                            int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c) {
  const char* where = "gemm_strided_batched";
  if (ctx == nullptr) return Status(where, "no GemmContext");
  if (batch == 0) return Status();
  if (stride_a < 0 || stride_b < 0 || stride_c < 0) return Status(where, "negative stride");
  return gemm_with(ctx, stream, Target{ctx->workspace, 0}, p.trans_a, p.trans_b, p.m, p.n, p.k,
                   p.alpha, p.a, p.lda, p.b, p.ldb, p.beta, p.c, p.ldc,
                   Batch{batch, stride_a, stride_b, stride_c});
}

template <typename TC>
Status gemm_group(GemmContext* ctx, cudaStream_t stream,
                  std::span<const GemmProblemOf<TC>> problems) {
  const char* where = "gemm_group";
  if (ctx == nullptr) return Status(where, "no GemmContext");
  if (ctx->lanes.empty()) {
    for (const GemmProblemOf<TC>& p : problems) {
      if (Status s = gemm<TC>(ctx, stream, p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, p.a, p.lda,
                              p.b, p.ldb, p.beta, p.c, p.ldc);
          !s.ok()) {
        return s;
      }
    }
    return Status();
  }
  const size_t used = std::min(ctx->lanes.size(), problems.size());
  if (used == 0) return Status();
  // Fork: every lane starts after what is queued on `stream`.
  if (cudaError_t e = cudaEventRecord(ctx->fork, stream); e != cudaSuccess) {
    return Status::Cuda(where, e);
  }
  for (size_t i = 0; i < used; ++i) {
    if (cudaError_t e = cudaStreamWaitEvent(ctx->lanes[i].stream, ctx->fork, 0); e != cudaSuccess) {
      return Status::Cuda(where, e);
    }
  }
  Status status;
  for (size_t i = 0; i < problems.size() && status.ok(); ++i) {
    const GemmProblemOf<TC>& p = problems[i];
    const GemmLane& lane = ctx->lanes[i % used];
    status =
        gemm_with(ctx, lane.stream, Target{lane.workspace, ctx->lane_sm_count}, p.trans_a,
                  p.trans_b, p.m, p.n, p.k, p.alpha, p.a, p.lda, p.b, p.ldb, p.beta, p.c, p.ldc);
  }
  // Join, even after an error: nothing queued on `stream` later may overtake the lanes.
  for (size_t i = 0; i < used; ++i) {
    cudaError_t e = cudaEventRecord(ctx->lanes[i].done, ctx->lanes[i].stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, ctx->lanes[i].done, 0);
    if (e != cudaSuccess && status.ok()) status = Status::Cuda(where, e);
  }
  return status;
}

template Status gemm<bf16>(GemmContext*, cudaStream_t, bool, bool, int64_t, int64_t, int64_t, float,
                           const bf16*, int64_t, const bf16*, int64_t, float, bf16*, int64_t);
template Status gemm<float>(GemmContext*, cudaStream_t, bool, bool, int64_t, int64_t, int64_t,
                            float, const bf16*, int64_t, const bf16*, int64_t, float, float*,
                            int64_t);

template Status gemm_add<bf16>(GemmContext*, cudaStream_t, bool, bool, int64_t, int64_t, int64_t,
                               float, const bf16*, int64_t, const bf16*, int64_t, float,
                               const bf16*, bf16*, int64_t);
template Status gemm_add<float>(GemmContext*, cudaStream_t, bool, bool, int64_t, int64_t, int64_t,
                                float, const bf16*, int64_t, const bf16*, int64_t, float,
                                const float*, float*, int64_t);

template Status gemm_group<bf16>(GemmContext*, cudaStream_t, std::span<const GemmProblemOf<bf16>>);
template Status gemm_group<float>(GemmContext*, cudaStream_t,
                                  std::span<const GemmProblemOf<float>>);
template Status gemm_strided_batched<bf16>(GemmContext*, cudaStream_t, const GemmProblemOf<bf16>&,
                                           int64_t, int64_t, int64_t, int64_t);
template Status gemm_strided_batched<float>(GemmContext*, cudaStream_t, const GemmProblemOf<float>&,
                                            int64_t, int64_t, int64_t, int64_t);

}  // namespace hcp::cuda
