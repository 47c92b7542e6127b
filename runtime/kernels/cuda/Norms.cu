// RMSNorm and Mamba2's gated RMSNorm (gate before the norm), forward and backward.
//
// One forward and one backward kernel serve both variants; they differ only in how the normalized
// input u comes from its bf16 tensors (Plain: u = x; Gated: u = y silu(z)) and how the input
// gradients follow from du (the Plain and Gated policies below).
//
// Rows are memory-bound, so the design is about keeping enough bytes in flight without stalls:
// - A team of 1 to 32 warps owns a row: at most 4 groups of 8 columns per lane, so a row's data
//   is spread over many threads. A one-warp team reduces with shuffles only; a larger one adds one
//   named barrier per row (bar.sync for the team, so the other teams of the block never wait).
// - Blocks of 256 threads hold several teams, each on its own row.
// - On the 16-byte path each thread copies its own groups of its team's next row into its own
//   shared-memory slots (cp.async) before working on the current one: loads stay in flight
//   through the reduction without registers to hold them, and no barrier is needed since a
//   thread reads back only what it copied. The second pass re-reads the slots. Unaligned rows,
//   and the widest (teams of 16 or 32 warps, whose slots would not fit), load from global memory
//   directly, the second pass re-reading the same thread's recent loads (L1/L2 hits).
// - The backward prefetches the saved rstd one row ahead, so no row waits on it.
//
// The backward's weight gradient is deterministic: the rows are cut into fixed chunks, one per
// block, from the shape alone (not the GPU). Each lane sums its columns over its team's rows in row
// order, the teams of a block add theirs in team order through shared memory, the block writes one
// fp32 partial [dim], and sum_partials adds the (at most kNormPartials) partials in block order.
// Few partials keep that second pass short (it reads them in chains of kNormPartials / 8).
#include <atomic>
#include <cmath>

#include "runtime/kernels/cuda/Common.cuh"

namespace hcp::cuda {
namespace {

using namespace detail;

constexpr int64_t kMaxDim = 32768;
// Blocks (and weight-gradient partials) of the backward: two per SM of an H200 at the backward's
// occupancy. Fewer leave too few rows in flight (64 or 128 measured up to 2 times slower); more
// make the partials' second pass longer.
constexpr int64_t kNormPartials = 256;
// Threads per block when a row's team fits in it (a team of at most 8 warps).
constexpr int kBlockThreads = 256;
// Groups of 8 columns per lane at most (more cost registers, and measured slower).
constexpr int kMaxVpt = 4;
// Rows in a thread's shared-memory slots: the current one and the next (a third did not help).
constexpr int kSlotRows = 2;

// bf16 bits <-> fp32: the high half of the fp32 word.
__device__ __forceinline__ void unpack8(float (&v)[8], uint4 raw) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    v[2 * i] = __uint_as_float(words[i] << 16);
    v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint32_t pair_bits(const bf16* p, int i, int valid) {
  const uint32_t lo = i < valid ? __bfloat16_as_ushort(p[i]) : 0u;
  const uint32_t hi = i + 1 < valid ? __bfloat16_as_ushort(p[i + 1]) : 0u;
  return lo | (hi << 16);
}

// Up to 8 bf16 at p as raw bits; missing elements are +0.
__device__ __forceinline__ uint4 load_raw(const bf16* p, int valid, bool vec) {
  if (valid <= 0) return make_uint4(0, 0, 0, 0);
  if (vec && valid == 8) return *reinterpret_cast<const uint4*>(p);
  return make_uint4(pair_bits(p, 0, valid), pair_bits(p, 2, valid), pair_bits(p, 4, valid),
                    pair_bits(p, 6, valid));
}

// The same bits, opaque to the compiler: keeps it from holding (or hoisting) the unpacked fp32
// values across a row, which doubles the registers a row needs.
__device__ __forceinline__ uint4 hide(uint4 r) {
  asm volatile("" : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w));
  return r;
}

__device__ __forceinline__ float fast_sigmoid(float x) { return __fdividef(1.f, 1.f + __expf(-x)); }

__device__ __forceinline__ int group_valid(int c, int dim) { return max(0, min(8, dim - c)); }

// The variants: the input tensors (src), u from one group of them (value), and the input
// gradients from du (grad; the CPU's rms_row_backward and gated_rms_norm_backward).
struct Plain {
  static constexpr int kInputs = 1;
  const bf16* src[kInputs];  // x
  bf16* dx;
  const bf16* residual;  // added to dx when not null
  __device__ static void value(float (&u)[8], const uint4* raw) { unpack8(u, raw[0]); }
  __device__ void grad(int64_t at, const float (&du)[8], const uint4*, int valid, bool vec) const {
    if (residual == nullptr) {
      store8_any(dx + at, du, valid, vec);
      return;
    }
    float sum[8];
    load8_any(sum, residual + at, valid, vec);
#pragma unroll
    for (int e = 0; e < 8; e++) sum[e] += du[e];
    store8_any(dx + at, sum, valid, vec);
  }
};

struct Gated {
  static constexpr int kInputs = 2;
  const bf16* src[kInputs];  // y, z
  bf16* dy;
  bf16* dz;
  __device__ static void value(float (&u)[8], const uint4* raw) {
    float yv[8], zv[8];
    unpack8(yv, raw[0]);
    unpack8(zv, raw[1]);
#pragma unroll
    for (int e = 0; e < 8; e++) u[e] = yv[e] * zv[e] * fast_sigmoid(zv[e]);
  }
  __device__ void grad(int64_t at, const float (&du)[8], const uint4* raw, int valid,
                       bool vec) const {
    float yv[8], zv[8], dyv[8], dzv[8];
    unpack8(yv, raw[0]);
    unpack8(zv, raw[1]);
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const float s = fast_sigmoid(zv[e]);
      dyv[e] = du[e] * zv[e] * s;
      dzv[e] = du[e] * yv[e] * (s * (1.f + zv[e] * (1.f - s)));
    }
    store8_any(dy + at, dyv, valid, vec);
    store8_any(dz + at, dzv, valid, vec);
  }
};

// Compile-time shape of a launch: groups per lane; whether the pointers allow 16-byte accesses;
// whether a team fills a block of up to 1024 threads (64 registers, no slots).
template <int V, bool Vec, bool W>
struct Cfg {
  static constexpr int kVpt = V;
  static constexpr bool kVec = Vec;
  static constexpr int kThreads = W ? 1024 : kBlockThreads;
  // Rows in shared-memory slots (0: none, the groups come from global memory).
  static constexpr int kStages = Vec && !W ? kSlotRows : 0;
  // The slots' shared memory for a stream of N tensors.
  static constexpr size_t slot_bytes(int n) { return size_t{16} * kStages * V * n * kThreads; }
};

// This thread's team (the warps that share a row) and its place in it.
struct Team {
  int warps, index, count, warp, lane;
  __device__ explicit Team(int team_warps)
      : warps(team_warps),
        index((threadIdx.x >> 5) / team_warps),
        count((blockDim.x >> 5) / team_warps),
        warp((threadIdx.x >> 5) % team_warps),
        lane(threadIdx.x & 31) {}
  __device__ int col(int v) const { return ((v * warps + warp) * 32 + lane) * 8; }
  __device__ bool leader() const { return warp == 0 && lane == 0; }
  // Sums v over the team, returned to all its threads. Consecutive rows use the two halves of
  // `scratch` in turn: a warp writes a half again only after the next row's barrier, which every
  // warp reaches after reading this row's sums, so one barrier per row suffices.
  template <int N>
  __device__ void sum(float (&v)[N], float (&scratch)[2][32][2], int parity) const {
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = warp_sum(v[i]);
    if (warps == 1) return;
    float(*slots)[2] = scratch[parity] + index * warps;
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < N; i++) slots[warp][i] = v[i];
    }
    asm volatile("bar.sync %0, %1;" ::"r"(index + 1), "r"(warps * 32) : "memory");
#pragma unroll
    for (int i = 0; i < N; i++) {
      v[i] = 0.f;
      for (int w = 0; w < warps; w++) v[i] += slots[w][i];
    }
  }
};

__device__ __forceinline__ void copy16_async(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
               "l"(gmem)
               : "memory");
}

// The rows a team visits (row, row + step, ... below end) and this thread's groups of N tensors
// in them, staged through the thread's shared-memory slots S - 1 rows ahead, or (S = 0) read
// from global memory.
template <int N, class C>
struct RowStream {
  static constexpr int S = C::kStages;
  const bf16* const* src;
  const Team& team;
  int dim;
  int64_t row, step, end;
  uint4* slots;  // this thread's, [S][kVpt][N] strided by the block's threads
  int stage = 0;

  __device__ uint4* slot(int s, int v, int t) const {
    return slots + ((s * C::kVpt + v) * N + t) * C::kThreads;
  }
  __device__ void copy(int64_t r, int s) const {
    if (r >= end) return;
#pragma unroll
    for (int v = 0; v < C::kVpt; v++) {
      const int c = team.col(v);
      if (c >= dim) continue;
#pragma unroll
      for (int t = 0; t < N; t++) copy16_async(slot(s, v, t), src[t] + r * dim + c);
    }
  }
  __device__ void start() {
    if constexpr (S > 0) {
#pragma unroll
      for (int s = 0; s + 1 < S; s++) {
        copy(row + s * step, s);
        asm volatile("cp.async.commit_group;" ::: "memory");
      }
    }
  }
  // Makes `row` readable (and starts the copy of the row S - 1 visits ahead).
  __device__ void arrive() {
    if constexpr (S > 0) {
      copy(row + (S - 1) * step, stage == 0 ? S - 1 : stage - 1);
      asm volatile("cp.async.commit_group;" ::: "memory");
      asm volatile("cp.async.wait_group %0;" ::"n"(S - 1) : "memory");
    }
  }
  __device__ void advance() {
    row += step;
    stage = stage + 1 == S ? 0 : stage + 1;
  }
  // Group v of tensor t of the current row (zeros past the row's end).
  __device__ uint4 get(int v, int t) const {
    const int c = team.col(v), valid = group_valid(c, dim);
    if constexpr (S > 0) {
      return valid > 0 ? *slot(stage, v, t) : make_uint4(0, 0, 0, 0);
    } else {
      return load_raw(src[t] + row * dim + c, valid, C::kVec);
    }
  }
};

template <class In, class C>
__global__ void __launch_bounds__(C::kThreads)
    norm_forward_kernel(bf16* out, float* rstd, In in, const bf16* w, int64_t rows, int dim,
                        int team_warps, float eps) {
  constexpr int V = C::kVpt, N = In::kInputs;
  __shared__ float scratch[2][32][2];
  extern __shared__ uint4 slots[];
  const Team team(team_warps);
  RowStream<N, C> rs{in.src,
                     team,
                     dim,
                     int64_t{blockIdx.x} * team.count + team.index,
                     int64_t{gridDim.x} * team.count,
                     rows,
                     slots + threadIdx.x};
  rs.start();
  for (int parity = 0; rs.row < rows; rs.advance(), parity ^= 1) {
    rs.arrive();
    float ss[1] = {0.f};
#pragma unroll
    for (int v = 0; v < V; v++) {
      uint4 raw[N];
#pragma unroll
      for (int t = 0; t < N; t++) raw[t] = rs.get(v, t);
      float u[8];
      In::value(u, raw);
#pragma unroll
      for (int e = 0; e < 8; e++) ss[0] += u[e] * u[e];
    }
    team.sum(ss, scratch, parity);
    const float r = 1.f / sqrtf(ss[0] / static_cast<float>(dim) + eps);
    if (rstd != nullptr && team.leader()) rstd[rs.row] = r;
#pragma unroll
    for (int v = 0; v < V; v++) {
      const int c = team.col(v), valid = group_valid(c, dim);
      if (valid == 0) continue;
      uint4 raw[N];
#pragma unroll
      for (int t = 0; t < N; t++) raw[t] = rs.get(v, t);
      float u[8], wv[8];
      In::value(u, raw);
      unpack8(wv, load_raw(w + c, valid, C::kVec));
#pragma unroll
      for (int e = 0; e < 8; e++) u[e] = u[e] * r * wv[e];
      store8_any(out + rs.row * dim + c, u, valid, C::kVec);
    }
  }
}

// g: the output gradient. du = r (g w - u r^2 mean(g w u)); dw += g u r.
template <class In, class C>
__global__ void __launch_bounds__(C::kThreads)
    norm_backward_kernel(float* partials, In in, const bf16* g, const bf16* w, const float* rstd,
                         int64_t rows, int64_t chunk, int dim, int team_warps, float eps) {
  constexpr int V = C::kVpt, N = In::kInputs + 1;  // the inputs, then g
  __shared__ float scratch[2][32][2];
  extern __shared__ uint4 slots[];
  const Team team(team_warps);
  const bf16* src[N];
#pragma unroll
  for (int t = 0; t < N - 1; t++) src[t] = in.src[t];
  src[N - 1] = g;
  const int64_t first = int64_t{blockIdx.x} * chunk;
  RowStream<N, C> rs{src,
                     team,
                     dim,
                     first + team.index,
                     team.count,
                     first + chunk < rows ? first + chunk : rows,
                     slots + threadIdx.x};
  float acc[V][8] = {};
  // The weight stays in registers as bits; hide keeps the compiler from holding it unpacked.
  uint4 wraw[V];
#pragma unroll
  for (int v = 0; v < V; v++) {
    const int c = team.col(v);
    wraw[v] = load_raw(w + c, group_valid(c, dim), C::kVec);
  }
  rs.start();
  float saved_next = rstd != nullptr && rs.row < rs.end ? rstd[rs.row] : 0.f;
  for (int parity = 0; rs.row < rs.end; rs.advance(), parity ^= 1) {
    const float saved = saved_next;
    if (rstd != nullptr && rs.row + rs.step < rs.end) saved_next = rstd[rs.row + rs.step];
    rs.arrive();
    float sums[2] = {0.f, 0.f};  // sum g w u, sum u^2
#pragma unroll
    for (int v = 0; v < V; v++) {
      uint4 raw[N];
#pragma unroll
      for (int t = 0; t < N; t++) raw[t] = rs.get(v, t);
      float u[8], gv[8], wv[8];
      In::value(u, raw);
      unpack8(gv, raw[N - 1]);
      unpack8(wv, hide(wraw[v]));
#pragma unroll
      for (int e = 0; e < 8; e++) {
        sums[0] += gv[e] * wv[e] * u[e];
        sums[1] += u[e] * u[e];
      }
    }
    team.sum(sums, scratch, parity);
    const float r = rstd != nullptr ? saved : 1.f / sqrtf(sums[1] / static_cast<float>(dim) + eps);
    const float k = r * r * (sums[0] / static_cast<float>(dim));
#pragma unroll
    for (int v = 0; v < V; v++) {
      const int c = team.col(v), valid = group_valid(c, dim);
      if (valid == 0) continue;
      uint4 raw[N];
#pragma unroll
      for (int t = 0; t < N; t++) raw[t] = hide(rs.get(v, t));
      float u[8], gv[8], wv[8], du[8];
      In::value(u, raw);
      unpack8(gv, raw[N - 1]);
      unpack8(wv, hide(wraw[v]));
#pragma unroll
      for (int e = 0; e < 8; e++) {
        du[e] = r * (gv[e] * wv[e] - u[e] * k);
        acc[v][e] += gv[e] * u[e] * r;
      }
      in.grad(rs.row * dim + c, du, raw, valid, C::kVec);
    }
  }
  // The block's partial: team t adds its sums to those of teams 0..t-1 in shared memory (the
  // slots', free once every team is done), the last one writes.
  if (team.count == 1) {
#pragma unroll
    for (int v = 0; v < V; v++) {
      const int c = team.col(v);
      store8_any(partials + blockIdx.x * int64_t{dim} + c, acc[v], group_valid(c, dim), C::kVec);
    }
    return;
  }
  float* block_dw = reinterpret_cast<float*>(slots);  // [dim]
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  for (int t = 0; t < team.count; t++) {
    if (team.index == t) {
#pragma unroll
      for (int v = 0; v < V; v++) {
        const int c = team.col(v), valid = group_valid(c, dim);
        if (valid == 0) continue;
        if (t > 0) {
#pragma unroll
          for (int e = 0; e < 8; e++) acc[v][e] += e < valid ? block_dw[c + e] : 0.f;
        }
        if (t + 1 == team.count) {
          store8_any(partials + blockIdx.x * int64_t{dim} + c, acc[v], valid, C::kVec);
        } else {
#pragma unroll
          for (int e = 0; e < 8; e++) {
            if (e < valid) block_dw[c + e] = acc[v][e];
          }
        }
      }
    }
    if (t + 1 < team.count) __syncthreads();
  }
}

// How a row of `dim` columns is split: team_warps warps per row, vpt groups of 8 per lane, teams
// per block of `threads` threads; wide: a team of more than one block's 256 threads.
struct Layout {
  int vpt, team_warps, teams, threads;
  bool wide;
};
Layout layout(int64_t dim) {
  const int64_t groups = ceil_div(dim, 8);
  int team = 1;
  while (team * 32 * kMaxVpt < groups) team *= 2;
  Layout l;
  l.vpt = static_cast<int>(ceil_div(groups, team * 32));
  l.team_warps = team;
  l.wide = team * 32 > kBlockThreads;
  l.threads = l.wide ? team * 32 : kBlockThreads;
  l.teams = l.threads / (team * 32);
  return l;
}

// Calls launch(Cfg<...>{}) for the layout. A wide team has more than 1024 groups, so 3 or 4 each.
template <bool Vec, typename Launch>
void dispatch_vec(const Layout& l, Launch&& launch) {
  if (l.wide) {
    if (l.vpt == 3) return launch(Cfg<3, Vec, true>{});
    return launch(Cfg<4, Vec, true>{});
  }
  switch (l.vpt) {
    case 1:
      return launch(Cfg<1, Vec, false>{});
    case 2:
      return launch(Cfg<2, Vec, false>{});
    case 3:
      return launch(Cfg<3, Vec, false>{});
    default:
      return launch(Cfg<4, Vec, false>{});
  }
}
template <typename Launch>
void dispatch(const Layout& l, bool vec, Launch&& launch) {
  if (vec) return dispatch_vec<true>(l, launch);
  dispatch_vec<false>(l, launch);
}

Status check_shape(const char* name, int64_t rows, int64_t dim) {
  if (rows < 0 || dim <= 0) return Status(name, "rows must be >= 0 and dim > 0");
  if (dim > kMaxDim) return Status(name, "dim above 32768 is not supported");
  return Status();
}

// Shared memory beyond 48 KiB (static and dynamic together) needs the kernel's consent, once per
// device; `allowed` is the kernel's record of the devices done (asking on every launch would put
// the driver call on the launch's critical path).
template <typename Kernel>
Status allow_shared(const char* name, Kernel kernel, size_t bytes, std::atomic<uint64_t>& allowed) {
  if (bytes == 0) return Status();
  int device = 0;
  if (cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) {
    return Status::Cuda(name, error);
  }
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if ((allowed.load(std::memory_order_relaxed) & bit) != 0) return Status();
  const cudaError_t error = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (error != cudaSuccess) return Status::Cuda(name, error);
  allowed.fetch_or(bit, std::memory_order_relaxed);
  return Status();
}

template <class In>
Status norm_forward(const char* name, cudaStream_t stream, bf16* out, float* rstd, In in,
                    const bf16* w, int64_t rows, int64_t dim, float eps, bool vec) {
  if (Status s = check_shape(name, rows, dim); !s.ok()) return s;
  if (rows == 0) return Status();
  const Layout l = layout(dim);
  // A team per row (no cross-row sums, so nothing to fix); the kernel strides over any rest.
  const auto grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(rows, l.teams), 1 << 20));
  Status status;
  dispatch(l, vec, [&](auto cfg) {
    using C = decltype(cfg);
    const auto kernel = norm_forward_kernel<In, C>;
    const size_t shared = C::slot_bytes(In::kInputs);
    static std::atomic<uint64_t> allowed{0};
    if (status = allow_shared(name, kernel, shared, allowed); !status.ok()) return;
    kernel<<<grid, l.threads, shared, stream>>>(out, rstd, in, w, rows, static_cast<int>(dim),
                                                l.team_warps, eps);
  });
  if (!status.ok()) return status;
  return launch_status(name);
}

size_t backward_workspace_bytes(int64_t rows, int64_t dim) {
  return sizeof(float) * std::min<int64_t>(std::max<int64_t>(rows, 1), kNormPartials) *
         std::max<int64_t>(dim, 0);
}

template <class In>
Status norm_backward(const char* name, cudaStream_t stream, bf16* dw, In in, const bf16* g,
                     const bf16* w, const float* rstd, int64_t rows, int64_t dim, float eps,
                     bool vec, Workspace workspace) {
  if (Status s = check_shape(name, rows, dim); !s.ok()) return s;
  if (rows == 0) return fill(stream, dw, 0.f, dim);
  if (workspace.ptr == nullptr || workspace.bytes < backward_workspace_bytes(rows, dim)) {
    return Status(name, "workspace too small");
  }
  float* partials = static_cast<float*>(workspace.ptr);
  const Layout l = layout(dim);
  // Rows per block from the shape alone, a multiple of the block's teams.
  const int64_t chunk = round_up(ceil_div(rows, kNormPartials), l.teams);
  const int64_t blocks = ceil_div(rows, chunk);
  Status status;
  dispatch(l, vec && aligned16(partials), [&](auto cfg) {
    using C = decltype(cfg);
    const auto kernel = norm_backward_kernel<In, C>;
    // The slots also hold the teams' weight-gradient sums at the end (at most 16 KiB without
    // slots: several teams per block means at most 4 warps, 4096 columns, per row).
    const size_t slots = C::slot_bytes(In::kInputs + 1);
    const size_t shared = std::max(slots, l.teams > 1 ? sizeof(float) * dim : size_t{0});
    static std::atomic<uint64_t> allowed{0};
    if (status = allow_shared(name, kernel, slots, allowed); !status.ok()) return;
    kernel<<<static_cast<unsigned>(blocks), l.threads, shared, stream>>>(
        partials, in, g, w, rstd, rows, chunk, static_cast<int>(dim), l.team_warps, eps);
  });
  if (!status.ok()) return status;
  if (Status s = launch_status(name); !s.ok()) return s;
  return sum_partials(stream, dw, partials, blocks, dim);
}

}  // namespace

Status rms_norm_forward(cudaStream_t stream, bf16* y, float* rstd, const bf16* x, const bf16* w,
                        int64_t rows, int64_t dim, float eps) {
  const bool vec = dim % 8 == 0 && aligned16(y) && aligned16(x) && aligned16(w);
  return norm_forward("rms_norm.forward", stream, y, rstd, Plain{{x}, nullptr, nullptr}, w, rows,
                      dim, eps, vec);
}

size_t rms_norm_backward_workspace_bytes(int64_t rows, int64_t dim) {
  return backward_workspace_bytes(rows, dim);
}

Status rms_norm_backward(cudaStream_t stream, bf16* dx, bf16* dw, const bf16* dy, const bf16* x,
                         const bf16* w, const bf16* dresidual, const float* rstd, int64_t rows,
                         int64_t dim, float eps, Workspace workspace) {
  const bool vec = dim % 8 == 0 && aligned16(dx) && aligned16(dy) && aligned16(x) && aligned16(w) &&
                   (dresidual == nullptr || aligned16(dresidual));
  return norm_backward("rms_norm.backward", stream, dw, Plain{{x}, dx, dresidual}, dy, w, rstd,
                       rows, dim, eps, vec, workspace);
}

Status gated_rms_norm_forward(cudaStream_t stream, bf16* out, float* rstd, const bf16* y,
                              const bf16* z, const bf16* w, int64_t rows, int64_t dim, float eps) {
  const bool vec = dim % 8 == 0 && aligned16(out) && aligned16(y) && aligned16(z) && aligned16(w);
  return norm_forward("gated_rms_norm.forward", stream, out, rstd, Gated{{y, z}, nullptr, nullptr},
                      w, rows, dim, eps, vec);
}

size_t gated_rms_norm_backward_workspace_bytes(int64_t rows, int64_t dim) {
  return backward_workspace_bytes(rows, dim);
}

Status gated_rms_norm_backward(cudaStream_t stream, bf16* dy, bf16* dz, bf16* dw, const bf16* dout,
                               const bf16* y, const bf16* z, const bf16* w, const float* rstd,
                               int64_t rows, int64_t dim, float eps, Workspace workspace) {
  const bool vec = dim % 8 == 0 && aligned16(dy) && aligned16(dz) && aligned16(dout) &&
                   aligned16(y) && aligned16(z) && aligned16(w);
  return norm_backward("gated_rms_norm.backward", stream, dw, Gated{{y, z}, dy, dz}, dout, w, rstd,
                       rows, dim, eps, vec, workspace);
}

}  // namespace hcp::cuda
