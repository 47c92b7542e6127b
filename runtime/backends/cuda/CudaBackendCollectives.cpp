// The collectives of the CUDA backend, for context parallelism over the GPUs of a cp group:
// halo exchange, Mamba state scan, ring attention and all-reduce, in KernelTable.txt's order.
// NCCL moves the data (StepResources::nccl, group ranks as in Communicator.h); the arithmetic on
// what arrives runs in runtime/kernels/cuda (CollectiveKernels.h, the attention kernels). The
// algorithms, and who sends what to whom, are the CPU reference's (runtime/backends/cpu/
// Collectives.cpp); this file only says how each step maps onto device buffers and streams.
//
// Scratch comes from the step workspace: each collective's *Scratch::Carve cuts its pieces, and
// its WorkspaceBytes sizes the workspace with the same Carve on a null base. Everything is
// queued on the step's stream and returns without waiting, except ring attention's K/V prefetch,
// which runs on resources.comm_stream, ordered by two events.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/str_format.h"
#include "runtime/backends/cuda/StepArgs.h"
#include "runtime/comm/SegmentRoutes.h"
#include "runtime/kernels/cuda/CollectiveKernels.h"
#include "runtime/kernels/cuda/Kernels.h"
#include "runtime/kernels/cuda/SequenceKernels.h"
#include "runtime/support/Status.h"

namespace hcp::cuda_backend::detail {
namespace {

using comm::Group;
using comm::kNoRank;
using comm::RemoteOwner;
using comm::VisiblePairs;
using plan::DType;

absl::Status Cuda(cudaError_t error, const char* what) { return FromCuda(error, what); }

size_t ElementBytes(DType dtype) { return dtype == DType::BF16 ? 2 : 4; }
ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return ncclBfloat16;
    case DType::I32:
      return ncclInt32;
    default:
      return ncclFloat32;
  }
}

// A [rows, n, channels] tensor (row = b * segs + k) of `bytes`-sized elements: rows of local
// segment k, window [first, first + count) of its n, for every batch row, as a 2-D copy.
struct SegmentWindow {
  std::byte* base;
  int64_t segs, n, channels;
  size_t element;
  std::byte* at(int64_t k, int64_t first) const {
    return base + ((k * n + first) * channels) * element;
  }
  size_t pitch() const { return static_cast<size_t>(segs * n * channels) * element; }
};

// Copies `count` rows of segment window `from` (segment kf at row rf) to `to` (kt, rt), for every
// batch row.
absl::Status CopyRows(const SegmentWindow& to, int64_t kt, int64_t rt, const SegmentWindow& from,
                      int64_t kf, int64_t rf, int64_t count, int64_t batch, cudaStream_t stream) {
  const size_t width = static_cast<size_t>(count * from.channels) * from.element;
  return Cuda(cudaMemcpy2DAsync(to.at(kt, rt), to.pitch(), from.at(kf, rf), from.pitch(), width,
                                static_cast<size_t>(batch), cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpy2DAsync (halo)");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Halo exchange. Exchange k moves every rank's segment-k tail to the rank of the next segment
// (the backward: the halo gradients back).
namespace {

// The transfer buffers: [batch, width, c] each, one segment's rows per batch row.
struct HaloScratch {
  std::byte* send;
  std::byte* recv;
  size_t bytes;
  template <typename HaloArgs>
  static HaloScratch Carve(cuda::Workspace ws, const HaloArgs& args, size_t es) {
    Carver carve(ws);
    const int64_t piece = args.batch * args.width * args.channels;
    HaloScratch h{carve.take<std::byte>(piece * es), carve.take<std::byte>(piece * es), 0};
    h.bytes = carve.used();
    return h;
  }
};

// A step's halo geometry, in the conv input's element type (`dtype`), and its transfer buffers.
struct Halo {
  int64_t batch, segs, len, channels, width, me;
  DType dtype;
  size_t es;
  SegmentWindow send, recv;

  template <typename HaloArgs>
  static Halo Of(const Args& a, const HaloArgs& args, DType dtype) {
    Halo h{.batch = args.batch,
           .segs = args.segs,
           .len = args.len,
           .channels = args.channels,
           .width = args.width,
           .me = a.cp_index(),
           .dtype = dtype,
           .es = ElementBytes(dtype),
           .send = {},
           .recv = {}};
    const HaloScratch scratch = HaloScratch::Carve(a.workspace(), args, h.es);
    h.send = {scratch.send, 1, h.width, h.channels, h.es};
    h.recv = {scratch.recv, 1, h.width, h.channels, h.es};
    return h;
  }
  int64_t piece() const { return batch * width * channels; }
  SegmentWindow Window(const std::byte* base, int64_t n) const {
    return {const_cast<std::byte*>(base), segs, n, channels, es};
  }
  // Sends `send` to dest and receives `recv` from source (either may be kNoRank).
  void Exchange(const Args& a, int dest, int source) const {
    a.nccl().SendRecv(send.base, piece(), dest, recv.base, piece(), source, NcclType(dtype),
                      Group::kCp, a.stream());
  }
};

}  // namespace

// x [rows,len,c] -> halo [rows,width,c].
absl::Status RunHaloExchangeForward(const Args& a,
                                    const plan::HaloExchangeForwardArgs<DeviceBuffer>& args) {
  const plan::Mesh& mesh = a.mesh();
  const Halo h = Halo::Of(a, args, args.x.dtype());
  const SegmentWindow x = h.Window(args.x.as<std::byte>(), h.len);
  const SegmentWindow halo = h.Window(args.halo.as<std::byte>(), h.width);
  for (int64_t k = 0; k < h.segs; ++k) {
    const int64_t j = mesh.GlobalSegment(h.me, k);
    const int dest = RemoteOwner(mesh, h.me, j + 1), source = RemoteOwner(mesh, h.me, j - 1);
    if (dest != kNoRank) {
      HCP_RETURN_IF_ERROR(
          CopyRows(h.send, 0, 0, x, k, h.len - h.width, h.width, h.batch, a.stream()));
    }
    h.Exchange(a, dest, source);
    if (source != kNoRank) {
      HCP_RETURN_IF_ERROR(CopyRows(halo, k, 0, h.recv, 0, 0, h.width, h.batch, a.stream()));
    } else if (j == 0) {  // the sequence starts here: zeros
      HCP_RETURN_IF_ERROR(Cuda(cudaMemset2DAsync(halo.at(k, 0), halo.pitch(), 0,
                                                 static_cast<size_t>(h.width * h.channels) * h.es,
                                                 static_cast<size_t>(h.batch), a.stream()),
                               "cudaMemset2DAsync (halo)"));
    } else {  // the predecessor is this rank's own segment (zigzag, rank cp-1)
      HCP_RETURN_IF_ERROR(CopyRows(halo, k, 0, x, mesh.OwnerOf(j - 1).k, h.len - h.width, h.width,
                                   h.batch, a.stream()));
    }
  }
  return absl::OkStatus();
}

size_t WorkspaceBytes(const plan::HaloExchangeForwardArgs<DeviceBuffer>& args) {
  return HaloScratch::Carve(cuda::Workspace{}, args, ElementBytes(args.x.dtype())).bytes;
}

// dhalo [rows,width,c] -> dx [rows,len,c]: each segment's last `width` rows get the halo gradient
// of the segment after it, every other row zero.
absl::Status RunHaloExchangeBackward(const Args& a,
                                     const plan::HaloExchangeBackwardArgs<DeviceBuffer>& args) {
  const plan::Mesh& mesh = a.mesh();
  const Halo h = Halo::Of(a, args, args.dhalo.dtype());
  const SegmentWindow dhalo = h.Window(args.dhalo.as<std::byte>(), h.width);
  const SegmentWindow dx = h.Window(args.dx.as<std::byte>(), h.len);
  HCP_RETURN_IF_ERROR(
      Cuda(cudaMemsetAsync(dx.base, 0, h.batch * h.segs * h.len * h.channels * h.es, a.stream()),
           "cudaMemsetAsync (halo gradient)"));
  for (int64_t k = 0; k < h.segs; ++k) {
    const int64_t j = mesh.GlobalSegment(h.me, k);
    const int dest = RemoteOwner(mesh, h.me, j - 1), source = RemoteOwner(mesh, h.me, j + 1);
    if (dest != kNoRank) {
      HCP_RETURN_IF_ERROR(CopyRows(h.send, 0, 0, dhalo, k, 0, h.width, h.batch, a.stream()));
    }
    h.Exchange(a, dest, source);
    if (source != kNoRank) {
      HCP_RETURN_IF_ERROR(
          CopyRows(dx, k, h.len - h.width, h.recv, 0, 0, h.width, h.batch, a.stream()));
    } else if (j + 1 < mesh.segments()) {  // the successor is this rank's own segment
      HCP_RETURN_IF_ERROR(CopyRows(dx, k, h.len - h.width, dhalo, mesh.OwnerOf(j + 1).k, 0, h.width,
                                   h.batch, a.stream()));
    }  // else: the sequence's last segment feeds no halo (its tail stays zero)
  }
  return absl::OkStatus();
}
size_t WorkspaceBytes(const plan::HaloExchangeBackwardArgs<DeviceBuffer>& args) {
  return HaloScratch::Carve(cuda::Workspace{}, args, ElementBytes(args.dhalo.dtype())).bytes;
}

// ---------------------------------------------------------------------------------------------
// State scan, by either strategy (0 all-gather, 1 chain).
//   all-gather: every rank gathers every rank's g and s (ds_in) and walks all segments itself,
//     writing only its own: one collective, no sequential dependency between ranks.
//   chain: the carry travels from owner to owner in sequence order, one send/recv per hop.
namespace {

struct StateSizes {
  int64_t batch, segs, heads, pn;
  int64_t g_count() const { return batch * segs * heads; }
  int64_t state_count() const { return g_count() * pn; }
  int64_t run_count() const { return batch * heads * pn; }
};
template <typename StateScanArgs>
StateSizes StateSizesOf(const StateScanArgs& args) {
  return {args.batch, args.segs, args.heads, args.head_dim * args.state};
}
template <typename StateScanArgs>
bool AllGathers(const StateScanArgs& args) {
  return args.strategy == 0;
}

// The carry between segments and, with the all-gather strategy, every rank's g and states.
struct StateScratch {
  float* run;
  float* g_all;       // null with the chain
  float* states_all;  // null with the chain
  size_t bytes;
  static StateScratch Carve(cuda::Workspace ws, const StateSizes& z, int64_t cp, bool all_gather) {
    Carver carve(ws);
    StateScratch t{carve.take<float>(z.run_count()), nullptr, nullptr, 0};
    if (all_gather) {
      t.g_all = carve.take<float>(cp * z.g_count());
      t.states_all = carve.take<float>(cp * z.state_count());
    }
    t.bytes = carve.used();
    return t;
  }
};

// Walks the sequence's segments in order (or in reverse), carrying `run` [batch, heads, pn] from
// one to the next (zeros before the first), and calls step(mine, k, g, states, run) for each
// segment this rank handles: with the all-gather strategy every segment, its g and states
// (s, or ds_in) read from the owner's gathered copy; with the chain only this rank's own, the
// carry received from the previous segment's owner first and passed to the next one's after.
template <typename Step>
absl::Status WalkSegments(const Args& a, const StateSizes& z, bool all_gather, bool reverse,
                          const float* g, const float* states, Step step) {
  const plan::Mesh& mesh = a.mesh();
  const int64_t me = a.cp_index(), S = mesh.segments(), direction = reverse ? -1 : 1;
  const StateScratch scratch = StateScratch::Carve(a.workspace(), z, mesh.cp, all_gather);
  float* run = scratch.run;
  float* g_all = scratch.g_all;
  float* states_all = scratch.states_all;
  HCP_RETURN_IF_ERROR(Done(cuda::fill<float>(a.stream(), run, 0.f, z.run_count())));
  if (all_gather) {  // one NCCL launch for both: the scan's cost is mostly latency
    a.nccl().GroupStart();
    a.nccl().AllGather(g, g_all, z.g_count(), ncclFloat32, Group::kCp, a.stream());
    a.nccl().AllGather(states, states_all, z.state_count(), ncclFloat32, Group::kCp, a.stream());
    a.nccl().GroupEnd();
  }
  for (int64_t n = 0; n < S; ++n) {
    const int64_t j = reverse ? S - 1 - n : n;
    const auto [owner, k] = mesh.OwnerOf(j);
    if (all_gather) {
      HCP_RETURN_IF_ERROR(step(owner == me, k, g_all + owner * z.g_count(),
                               states_all + owner * z.state_count(), run));
      continue;
    }
    if (owner != me) continue;
    if (const int from = RemoteOwner(mesh, me, j - direction); from != kNoRank) {
      a.nccl().SendRecv(nullptr, 0, kNoRank, run, z.run_count(), from, ncclFloat32, Group::kCp,
                        a.stream());
    }  // else: the first segment (zeros) or the previous one was this rank's (run holds it)
    HCP_RETURN_IF_ERROR(step(true, k, g, states, run));
    if (const int to = RemoteOwner(mesh, me, j + direction); to != kNoRank) {
      a.nccl().SendRecv(run, z.run_count(), to, nullptr, 0, kNoRank, ncclFloat32, Group::kCp,
                        a.stream());
    }
  }
  return absl::OkStatus();
}

}  // namespace

// g [rows,heads], s [rows,heads,pn] -> s_in (as s).
absl::Status RunStateScanForward(const Args& a,
                                 const plan::StateScanForwardArgs<DeviceBuffer>& args) {
  const StateSizes z = StateSizesOf(args);
  float* s_in = args.s_in.as<float>();
  return WalkSegments(
      a, z, AllGathers(args), /*reverse=*/false, args.g.as<float>(), args.s.as<float>(),
      [&](bool mine, int64_t k, const float* g, const float* s, float* run) {
        return Done(cuda::state_pass_forward(a.stream(), mine ? s_in : nullptr, run, g, s, z.batch,
                                             z.segs, k, z.heads, z.pn));
      });
}
size_t WorkspaceBytes(const plan::StateScanForwardArgs<DeviceBuffer>& args,
                      const plan::Mesh& mesh) {
  return StateScratch::Carve(cuda::Workspace{}, StateSizesOf(args), mesh.cp, AllGathers(args))
      .bytes;
}

absl::Status RunStateScanBackward(const Args& a,
                                  const plan::StateScanBackwardArgs<DeviceBuffer>& args) {
  const StateSizes z = StateSizesOf(args);
  const float* s_in = args.s_in.as<float>();
  float* dg = args.dg.as<float>();
  float* ds = args.ds.as<float>();
  return WalkSegments(a, z, AllGathers(args), /*reverse=*/true, args.g.as<float>(),
                      args.ds_in.as<float>(),
                      [&](bool mine, int64_t k, const float* g, const float* ds_in, float* run) {
                        return Done(cuda::state_pass_backward(
                            a.stream(), mine ? dg : nullptr, mine ? ds : nullptr, run, g, ds_in,
                            mine ? s_in : nullptr, z.batch, z.segs, k, z.heads, z.pn));
                      });
}
size_t WorkspaceBytes(const plan::StateScanBackwardArgs<DeviceBuffer>& args,
                      const plan::Mesh& mesh) {
  return StateScratch::Carve(cuda::Workspace{}, StateSizesOf(args), mesh.cp, AllGathers(args))
      .bytes;
}

// ---------------------------------------------------------------------------------------------
// Ring attention (seq: the local one). The attention kernels run on one (query segment, key
// segment) pair of one batch row at a time, whose rows are contiguous in the [b, s, h, d] tensors;
// the pairs of a ring step are the CPU's (VisiblePairs: a key segment entirely after a query
// segment is skipped when causal).
namespace {

struct RingShape {
  int64_t batch, seq, q_heads, kv_heads, dim, segs, len;
  bool causal;
  int64_t q_count() const { return batch * seq * q_heads * dim; }
  int64_t kv_count() const { return batch * seq * kv_heads * dim; }
  int64_t lse_count() const { return batch * q_heads * seq; }
  // Offsets of batch row b, local segment k: in a q-like / kv-like tensor, and in lse's row 0.
  int64_t q_at(int64_t b, int64_t k) const { return (b * seq + k * len) * q_heads * dim; }
  int64_t kv_at(int64_t b, int64_t k) const { return (b * seq + k * len) * kv_heads * dim; }
  int64_t lse_at(int64_t b, int64_t k) const { return b * q_heads * seq + k * len; }
  // ... and in the position_ids [batch, seq] of packed documents.
  int64_t positions_at(int64_t b, int64_t k) const { return b * seq + k * len; }
  cuda::AttentionShape piece() const { return {1, len, len, q_heads, kv_heads, dim}; }
};

template <typename RingAttentionArgs>
RingShape RingShapeOf(const RingAttentionArgs& args, const plan::Mesh& mesh) {
  const int64_t segs = mesh.segments_per_rank();
  return RingShape{.batch = args.batch,
                   .seq = args.seq,
                   .q_heads = args.q_heads,
                   .kv_heads = args.kv_heads,
                   .dim = args.head_dim,
                   .segs = segs,
                   .len = args.seq / segs,
                   .causal = args.causal};
}

// The forward's scratch: two K/V blocks [k | v] (the one in hand, the one arriving), the fp32
// running result, and one pair's partial result.
struct RingForwardScratch {
  bf16* blocks[2];
  float* acc_out;
  float* acc_lse;
  bf16* part_out;
  float* part_lse;
  size_t bytes;
  static RingForwardScratch Carve(cuda::Workspace ws, const RingShape& r) {
    Carver carve(ws);
    RingForwardScratch t{};
    for (bf16*& block : t.blocks) block = carve.take<bf16>(2 * r.kv_count());
    t.acc_out = carve.take<float>(r.q_count());
    t.acc_lse = carve.take<float>(r.lse_count());
    t.part_out = carve.take<bf16>(r.len * r.q_heads * r.dim);
    t.part_lse = carve.take<float>(r.q_heads * r.len);
    t.bytes = carve.used();
    return t;
  }
};

// The backward's scratch: two K/V blocks and two fp32 [dk | dv] sums travelling with them, the
// fp32 dq sum, one pair's gradients and query lse, and the attention backward's workspace.
struct RingBackwardScratch {
  bf16* blocks[2];
  float* grads[2];
  float* dq_sum;
  bf16* dq_part;
  bf16* dk_part;
  bf16* dv_part;
  float* lse_piece;
  cuda::Workspace kernel;
  size_t bytes;
  static RingBackwardScratch Carve(cuda::Workspace ws, const RingShape& r) {
    Carver carve(ws);
    RingBackwardScratch t{};
    for (bf16*& block : t.blocks) block = carve.take<bf16>(2 * r.kv_count());
    for (float*& grad : t.grads) grad = carve.take<float>(2 * r.kv_count());
    t.dq_sum = carve.take<float>(r.q_count());
    t.dq_part = carve.take<bf16>(r.len * r.q_heads * r.dim);
    t.dk_part = carve.take<bf16>(r.len * r.kv_heads * r.dim);
    t.dv_part = carve.take<bf16>(r.len * r.kv_heads * r.dim);
    t.lse_piece = carve.take<float>(r.q_heads * r.len);
    const size_t kernel_bytes = cuda::attention_backward_workspace_bytes(r.piece());
    t.kernel = {carve.take<std::byte>(kernel_bytes), kernel_bytes};
    t.bytes = carve.used();
    return t;
  }
};

// Starts passing `block` (count elements of `type`) to the next rank of the ring and receiving
// the previous rank's into `incoming`, on the communication stream, once the compute stream has
// finished with `incoming` (it held the block of two steps ago); `arrived` is recorded after.
void StartRingShift(const Args& a, const void* block, void* incoming, size_t count,
                    ncclDataType_t type) {
  const int64_t cp = a.mesh().cp, me = a.cp_index();
  cudaEventRecord(a.resources().compute_done, a.stream());
  cudaStreamWaitEvent(a.resources().comm_stream, a.resources().compute_done, 0);
  a.nccl().SendRecv(block, count, static_cast<int>((me + 1) % cp), incoming, count,
                    static_cast<int>((me - 1 + cp) % cp), type, Group::kCp,
                    a.resources().comm_stream);
  cudaEventRecord(a.resources().comm_done, a.resources().comm_stream);
}
// The compute stream waits for the block StartRingShift is receiving.
absl::Status AwaitRingShift(const Args& a) {
  return Cuda(cudaStreamWaitEvent(a.stream(), a.resources().comm_done, 0), "cudaStreamWaitEvent");
}

}  // namespace

// Per ring step: prefetch the next K/V block while this one's pairs run; each pair's partial
// result merges into fp32 running sums, rounded to bf16 at the end.
absl::Status RunRingAttentionForward(const Args& a,
                                     const plan::RingAttentionForwardArgs<DeviceBuffer>& args) {
  const plan::Mesh& mesh = a.mesh();
  const RingShape r = RingShapeOf(args, mesh);
  const int64_t cp = mesh.cp, me = a.cp_index(), kv = r.kv_count();
  const float scale = static_cast<float>(args.scale);
  const RingForwardScratch t = RingForwardScratch::Carve(a.workspace(), r);
  bf16* const* blocks = t.blocks;
  float* acc_out = t.acc_out;
  float* acc_lse = t.acc_lse;
  bf16* part_out = t.part_out;
  float* part_lse = t.part_lse;
  HCP_RETURN_IF_ERROR(Done(cuda::copy<bf16>(a.stream(), blocks[0], args.k.as<bf16>(), kv)));
  HCP_RETURN_IF_ERROR(Done(cuda::copy<bf16>(a.stream(), blocks[0] + kv, args.v.as<bf16>(), kv)));
  HCP_RETURN_IF_ERROR(Done(cuda::fill<float>(a.stream(), acc_out, 0.f, r.q_count())));
  HCP_RETURN_IF_ERROR(Done(cuda::fill<float>(a.stream(), acc_lse, -INFINITY, r.lse_count())));
  const bf16* q = args.q.as<bf16>();
  const int32_t* positions = a.positions(args.positions);  // the local queries' (documents)
  for (int64_t step = 0; step < cp; ++step) {
    const bf16* block = blocks[step % 2];
    if (step + 1 < cp) StartRingShift(a, block, blocks[(step + 1) % 2], 2 * kv, ncclBfloat16);
    const int64_t source = (me - step + cp) % cp;
    for (const comm::SegmentPair& p : VisiblePairs(mesh, me, source, r.len, r.causal)) {
      for (int64_t b = 0; b < r.batch; ++b) {
        HCP_RETURN_IF_ERROR(Done(cuda::attention_forward(
            a.stream(), part_out, part_lse, q + r.q_at(b, p.kq), block + r.kv_at(b, p.kk),
            block + kv + r.kv_at(b, p.kk), r.piece(), scale, r.causal, p.q_pos0, p.k_pos0,
            positions != nullptr ? positions + r.positions_at(b, p.kq) : nullptr)));
        HCP_RETURN_IF_ERROR(Done(cuda::attention_merge(a.stream(), acc_out + r.q_at(b, p.kq),
                                                       acc_lse + r.lse_at(b, p.kq), r.seq, part_out,
                                                       part_lse, r.len, r.q_heads, r.dim)));
      }
    }
    if (step + 1 < cp) HCP_RETURN_IF_ERROR(AwaitRingShift(a));
  }
  HCP_RETURN_IF_ERROR(Done(cuda::cast(a.stream(), args.out.as<bf16>(), acc_out, r.q_count())));
  return Done(cuda::copy<float>(a.stream(), args.lse.as<float>(), acc_lse, r.lse_count()));
}
size_t WorkspaceBytes(const plan::RingAttentionForwardArgs<DeviceBuffer>& args,
                      const plan::Mesh& mesh) {
  return RingForwardScratch::Carve(cuda::Workspace{}, RingShapeOf(args, mesh)).bytes;
}

// K/V travel ahead on the communication stream; their fp32 gradient sums [dk | dv] follow once
// this step's pairs have added to them, and after the last step go home (the block then in hand
// is the next rank's).
absl::Status RunRingAttentionBackward(const Args& a,
                                      const plan::RingAttentionBackwardArgs<DeviceBuffer>& args) {
  const plan::Mesh& mesh = a.mesh();
  const RingShape r = RingShapeOf(args, mesh);
  const int64_t cp = mesh.cp, me = a.cp_index(), kv = r.kv_count();
  const float scale = static_cast<float>(args.scale);
  const int next = static_cast<int>((me + 1) % cp), previous = static_cast<int>((me - 1 + cp) % cp);
  const RingBackwardScratch t = RingBackwardScratch::Carve(a.workspace(), r);
  bf16* const* blocks = t.blocks;
  float* const* grads = t.grads;
  float* dq_sum = t.dq_sum;
  bf16* dq_part = t.dq_part;
  bf16* dk_part = t.dk_part;
  bf16* dv_part = t.dv_part;
  float* lse_piece = t.lse_piece;
  const cuda::Workspace kernel_ws = t.kernel;
  const bf16 *dout = args.dout.as<bf16>(), *q = args.q.as<bf16>(), *out = args.out.as<bf16>();
  const float* lse = args.lse.as<float>();
  const int32_t* positions = a.positions(args.positions);  // the local queries' (documents)
  HCP_RETURN_IF_ERROR(Done(cuda::copy<bf16>(a.stream(), blocks[0], args.k.as<bf16>(), kv)));
  HCP_RETURN_IF_ERROR(Done(cuda::copy<bf16>(a.stream(), blocks[0] + kv, args.v.as<bf16>(), kv)));
  HCP_RETURN_IF_ERROR(Done(cuda::fill<float>(a.stream(), grads[0], 0.f, 2 * kv)));
  HCP_RETURN_IF_ERROR(Done(cuda::fill<float>(a.stream(), dq_sum, 0.f, r.q_count())));
  for (int64_t step = 0; step < cp; ++step) {
    const bf16* block = blocks[step % 2];
    float* grad = grads[step % 2];
    if (step + 1 < cp) StartRingShift(a, block, blocks[(step + 1) % 2], 2 * kv, ncclBfloat16);
    const int64_t source = (me - step + cp) % cp;
    for (const comm::SegmentPair& p : VisiblePairs(mesh, me, source, r.len, r.causal)) {
      for (int64_t b = 0; b < r.batch; ++b) {
        // The query rows' lse, [q_heads, len] out of [q_heads, seq].
        HCP_RETURN_IF_ERROR(
            Cuda(cudaMemcpy2DAsync(lse_piece, r.len * sizeof(float), lse + r.lse_at(b, p.kq),
                                   r.seq * sizeof(float), r.len * sizeof(float), r.q_heads,
                                   cudaMemcpyDeviceToDevice, a.stream()),
                 "cudaMemcpy2DAsync (lse)"));
        HCP_RETURN_IF_ERROR(Done(cuda::attention_backward(
            a.stream(), dq_part, dk_part, dv_part, dout + r.q_at(b, p.kq), q + r.q_at(b, p.kq),
            block + r.kv_at(b, p.kk), block + kv + r.kv_at(b, p.kk), out + r.q_at(b, p.kq),
            lse_piece, r.piece(), scale, r.causal, p.q_pos0, p.k_pos0, kernel_ws,
            positions != nullptr ? positions + r.positions_at(b, p.kq) : nullptr)));
        const int64_t q_piece = r.len * r.q_heads * r.dim, kv_piece = r.len * r.kv_heads * r.dim;
        HCP_RETURN_IF_ERROR(
            Done(cuda::accumulate(a.stream(), dq_sum + r.q_at(b, p.kq), dq_part, q_piece)));
        HCP_RETURN_IF_ERROR(
            Done(cuda::accumulate(a.stream(), grad + r.kv_at(b, p.kk), dk_part, kv_piece)));
        HCP_RETURN_IF_ERROR(
            Done(cuda::accumulate(a.stream(), grad + kv + r.kv_at(b, p.kk), dv_part, kv_piece)));
      }
    }
    if (step + 1 < cp) HCP_RETURN_IF_ERROR(AwaitRingShift(a));
    if (cp > 1) {  // the gradient sums follow their block (after the last step: home)
      a.nccl().SendRecv(grad, 2 * kv, next, grads[(step + 1) % 2], 2 * kv, previous, ncclFloat32,
                        Group::kCp, a.stream());
    }
  }
  // This rank's own dK/dV sums are now in hand.
  float* mine = cp > 1 ? grads[cp % 2] : grads[0];
  HCP_RETURN_IF_ERROR(Done(cuda::cast(a.stream(), args.dk.as<bf16>(), mine, kv)));
  HCP_RETURN_IF_ERROR(Done(cuda::cast(a.stream(), args.dv.as<bf16>(), mine + kv, kv)));
  return Done(cuda::cast(a.stream(), args.dq.as<bf16>(), dq_sum, r.q_count()));
}
size_t WorkspaceBytes(const plan::RingAttentionBackwardArgs<DeviceBuffer>& args,
                      const plan::Mesh& mesh) {
  return RingBackwardScratch::Carve(cuda::Workspace{}, RingShapeOf(args, mesh)).bytes;
}

// ---------------------------------------------------------------------------------------------
// Summed by NCCL in the buffer's dtype, over the group (0 world, 1 cp, 2 dp).
absl::Status RunAllReduce(const Args& a, const plan::AllReduceArgs<DeviceBuffer>& args) {
  a.nccl().AllReduceSum(args.x.as<std::byte>(), args.y.as<std::byte>(), args.n,
                        NcclType(args.x.dtype()), Group(args.group), a.stream());
  return absl::OkStatus();
}

}  // namespace hcp::cuda_backend::detail
