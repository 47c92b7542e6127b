#include "runtime/backends/cpu/Collectives.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/comm/ExpertRoutes.h"
#include "runtime/comm/SegmentRoutes.h"

namespace hcp::cpu {
namespace {

using comm::Group;
using comm::kNoRank;
using comm::RemoteOwner;
using comm::VisiblePairs;

template <typename T>
std::span<const std::byte> Bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span(v));
}
template <typename T>
std::span<std::byte> Bytes(std::vector<T>& v) {
  return std::as_writable_bytes(std::span(v));
}

// ---------------------------------------------------------------------------------------------
// Halo exchange.
//
// Who sends to whom. Segment j's halo comes from segment j-1.
//   contiguous: rank r's segment is r; its predecessor is rank r-1's (rank 0: zeros).
//   zigzag:     rank r's first segment is r: predecessor r-1 = rank r-1's FIRST segment.
//               rank r's second segment is 2cp-1-r: predecessor 2cp-2-r = 2cp-1-(r+1), which is
//               rank r+1's SECOND segment, except for r = cp-1, whose second segment (cp)
//               follows its own first (cp-1): a local copy, no message.
// So in both layouts a message always joins local segment k of one rank to local segment k of
// another: exchange k (k = 0, then 1) moves every rank's segment-k tail to the rank holding the
// next segment, a shift along the chain (first segments rightwards, second segments leftwards)
// in which every rank sends at most one message and receives at most one. The backward runs
// the same exchanges in the opposite direction.

// The rows of local segment k of batch row b in a [rows, n, channels] tensor.
struct SegmentRows {
  int64_t segs, n, channels;
  int64_t offset(int64_t b, int64_t k, int64_t row) const {
    return ((b * segs + k) * n + row) * channels;
  }
};

}  // namespace

void halo_exchange_forward(comm::Communicator& comm, const plan::Mesh& mesh, float* halo,
                           const float* x, int64_t batch, int64_t segs, int64_t len,
                           int64_t channels, int64_t width) {
  const int64_t me = comm.cp_index();
  const SegmentRows xs{segs, len, channels}, hs{segs, width, channels};
  const int64_t piece = width * channels;  // one batch row's halo of one segment
  std::vector<float> send(batch * piece), recv(batch * piece);
  for (int64_t k = 0; k < segs; ++k) {
    const int64_t j = mesh.GlobalSegment(me, k);
    const int dest = RemoteOwner(mesh, me, j + 1), source = RemoteOwner(mesh, me, j - 1);
    for (int64_t b = 0; b < batch; ++b) {  // the last `width` rows of segment k
      std::copy_n(x + xs.offset(b, k, len - width), piece, send.data() + b * piece);
    }
    comm.SendRecv(Bytes(send), dest, Bytes(recv), source, Group::kCp);
    for (int64_t b = 0; b < batch; ++b) {
      float* h = halo + hs.offset(b, k, 0);
      if (source != kNoRank) {
        std::copy_n(recv.data() + b * piece, piece, h);
      } else if (j == 0) {
        std::fill_n(h, piece, 0.0f);  // the sequence starts here
      } else {  // the predecessor is this rank's own segment (zigzag, rank cp-1)
        const int64_t pk = mesh.OwnerOf(j - 1).k;
        std::copy_n(x + xs.offset(b, pk, len - width), piece, h);
      }
    }
  }
}

void halo_exchange_backward(comm::Communicator& comm, const plan::Mesh& mesh, float* dx,
                            const float* dhalo, int64_t batch, int64_t segs, int64_t len,
                            int64_t channels, int64_t width) {
  const int64_t me = comm.cp_index();
  const SegmentRows xs{segs, len, channels}, hs{segs, width, channels};
  const int64_t piece = width * channels;
  std::fill_n(dx, batch * segs * len * channels, 0.0f);
  std::vector<float> send(batch * piece), recv(batch * piece);
  for (int64_t k = 0; k < segs; ++k) {
    const int64_t j = mesh.GlobalSegment(me, k);
    // Segment k's halo gradient goes back to its predecessor; its tail's comes from the successor.
    const int dest = RemoteOwner(mesh, me, j - 1), source = RemoteOwner(mesh, me, j + 1);
    for (int64_t b = 0; b < batch; ++b) {
      std::copy_n(dhalo + hs.offset(b, k, 0), piece, send.data() + b * piece);
    }
    comm.SendRecv(Bytes(send), dest, Bytes(recv), source, Group::kCp);
    for (int64_t b = 0; b < batch; ++b) {
      float* tail = dx + xs.offset(b, k, len - width);
      if (source != kNoRank) {
        std::copy_n(recv.data() + b * piece, piece, tail);
      } else if (j + 1 < mesh.segments()) {  // the successor is this rank's own segment
        const int64_t sk = mesh.OwnerOf(j + 1).k;
        std::copy_n(dhalo + hs.offset(b, sk, 0), piece, tail);
      }  // else: the last segment of the sequence, its tail feeds no halo (stays zero)
    }
  }
}

// ---------------------------------------------------------------------------------------------
// State scan. Per (batch row, head) the recurrence over global segments is
//   s_in[j+1] = exp(g[j]) s_in[j] + s[j],        s_in[0] = 0
// and its transpose, with G[j] the gradient reaching s_in[j] from everything after it,
//   G[j] = ds_in[j] + exp(g[j]) G[j+1],  G[S] = 0;   ds[j] = G[j+1],  dg[j] = exp(g[j]) <s_in[j],
//   G[j+1]>.
// The chain walks the segments in order (the backward in reverse), one hop per change of owner:
// contiguous 0 -> 1 -> ... -> cp-1; zigzag 0 -> 1 -> ... -> cp-1 (first segments), then
// cp-1 -> cp-2 -> ... -> 0 (second segments; rank cp-1 carries its own state across the turn).

namespace {

struct StateIndex {
  const StateScanShape& s;
  int64_t pn() const { return s.head_dim * s.state; }
  int64_t row(int64_t b, int64_t k) const { return b * s.segs + k; }
  int64_t g(int64_t b, int64_t k, int64_t h) const { return row(b, k) * s.heads + h; }
  int64_t state(int64_t b, int64_t k, int64_t h) const { return g(b, k, h) * pn(); }
  int64_t g_count() const { return s.batch * s.segs * s.heads; }
  int64_t state_count() const { return g_count() * pn(); }
  // One segment's states of every batch row and head: the chain's message, [batch, heads, pn].
  int64_t message_count() const { return s.batch * s.heads * pn(); }
  int64_t message(int64_t b, int64_t h) const { return (b * s.heads + h) * pn(); }
};

// The all-gather strategy's contribution of one rank: [g (g_count) | states (state_count)].
std::vector<float> GatherSegments(comm::Communicator& comm, const StateIndex& ix, const float* g,
                                  const float* states) {
  std::vector<float> mine(ix.g_count() + ix.state_count());
  std::copy_n(g, ix.g_count(), mine.begin());
  std::copy_n(states, ix.state_count(), mine.begin() + ix.g_count());
  std::vector<float> all(mine.size() * comm.size(Group::kCp));
  comm.AllGather(Bytes(mine), Bytes(all), Group::kCp);
  return all;
}

}  // namespace

void state_scan_forward(comm::Communicator& comm, const plan::Mesh& mesh, float* s_in,
                        const float* g, const float* s, const StateScanShape& shape,
                        StateScanStrategy strategy) {
  const StateIndex ix{shape};
  const int64_t me = comm.cp_index(), S = mesh.segments(), PN = ix.pn();

  if (strategy == StateScanStrategy::kAllGather) {
    const std::vector<float> all = GatherSegments(comm, ix, g, s);
    const int64_t per_rank = ix.g_count() + ix.state_count();
    std::vector<double> run(PN);
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t h = 0; h < shape.heads; ++h) {
        std::fill(run.begin(), run.end(), 0.0);
        for (int64_t j = 0; j < S; ++j) {
          const auto [owner, k] = mesh.OwnerOf(j);
          const float* theirs = all.data() + owner * per_rank;
          if (owner == me) {
            std::copy(run.begin(), run.end(), s_in + ix.state(b, k, h));  // to fp32
          }
          const double decay = std::exp(static_cast<double>(theirs[ix.g(b, k, h)]));
          const float* sj = theirs + ix.g_count() + ix.state(b, k, h);
          for (int64_t i = 0; i < PN; ++i) run[i] = decay * run[i] + static_cast<double>(sj[i]);
        }
      }
    }
    return;
  }

  // Chain: `run` holds s_in of the segment in hand for every batch row and head.
  std::vector<double> run(ix.message_count());
  std::vector<float> message(ix.message_count());
  for (int64_t j = 0; j < S; ++j) {
    const auto [owner, k] = mesh.OwnerOf(j);
    if (owner != me) continue;
    if (j == 0) {
      std::fill(run.begin(), run.end(), 0.0);
    } else if (const int from = RemoteOwner(mesh, me, j - 1); from != kNoRank) {
      comm.SendRecv({}, kNoRank, Bytes(message), from, Group::kCp);
      std::copy(message.begin(), message.end(), run.begin());
    }  // else: the previous segment was ours, `run` already holds its outgoing state
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t h = 0; h < shape.heads; ++h) {
        double* r = run.data() + ix.message(b, h);
        std::copy_n(r, PN, s_in + ix.state(b, k, h));
        const double decay = std::exp(static_cast<double>(g[ix.g(b, k, h)]));
        const float* sj = s + ix.state(b, k, h);
        for (int64_t i = 0; i < PN; ++i) r[i] = decay * r[i] + static_cast<double>(sj[i]);
      }
    }
    if (const int to = RemoteOwner(mesh, me, j + 1); to != kNoRank) {
      std::copy(run.begin(), run.end(), message.begin());
      comm.SendRecv(Bytes(message), to, {}, kNoRank, Group::kCp);
    }
  }
}

void state_scan_backward(comm::Communicator& comm, const plan::Mesh& mesh, float* dg, float* ds,
                         const float* ds_in, const float* g, const float* s_in,
                         const StateScanShape& shape, StateScanStrategy strategy) {
  const StateIndex ix{shape};
  const int64_t me = comm.cp_index(), S = mesh.segments(), PN = ix.pn();

  // One segment's step of the reverse scan for one (b, h): `grad` holds G[j+1] on entry and
  // G[j] on exit.
  auto step = [&](int64_t b, int64_t k, int64_t h, double g_j, const float* ds_in_j, double* grad,
                  bool mine) {
    const double decay = std::exp(g_j);
    if (mine) {
      double dot = 0.0;
      const float* sj = s_in + ix.state(b, k, h);
      for (int64_t i = 0; i < PN; ++i) dot += static_cast<double>(sj[i]) * grad[i];
      dg[ix.g(b, k, h)] = static_cast<float>(decay * dot);
      std::copy_n(grad, PN, ds + ix.state(b, k, h));
    }
    for (int64_t i = 0; i < PN; ++i) grad[i] = static_cast<double>(ds_in_j[i]) + decay * grad[i];
  };

  if (strategy == StateScanStrategy::kAllGather) {
    const std::vector<float> all = GatherSegments(comm, ix, g, ds_in);
    const int64_t per_rank = ix.g_count() + ix.state_count();
    std::vector<double> grad(PN);
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t h = 0; h < shape.heads; ++h) {
        std::fill(grad.begin(), grad.end(), 0.0);
        for (int64_t j = S - 1; j >= 0; --j) {
          const auto [owner, k] = mesh.OwnerOf(j);
          const float* theirs = all.data() + owner * per_rank;
          step(b, k, h, static_cast<double>(theirs[ix.g(b, k, h)]),
               theirs + ix.g_count() + ix.state(b, k, h), grad.data(), owner == me);
        }
      }
    }
    return;
  }

  std::vector<double> grad(ix.message_count());
  std::vector<float> message(ix.message_count());
  for (int64_t j = S - 1; j >= 0; --j) {
    const auto [owner, k] = mesh.OwnerOf(j);
    if (owner != me) continue;
    if (j == S - 1) {
      std::fill(grad.begin(), grad.end(), 0.0);
    } else if (const int from = RemoteOwner(mesh, me, j + 1); from != kNoRank) {
      comm.SendRecv({}, kNoRank, Bytes(message), from, Group::kCp);
      std::copy(message.begin(), message.end(), grad.begin());
    }
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t h = 0; h < shape.heads; ++h) {
        step(b, k, h, static_cast<double>(g[ix.g(b, k, h)]), ds_in + ix.state(b, k, h),
             grad.data() + ix.message(b, h), /*mine=*/true);
      }
    }
    if (const int to = RemoteOwner(mesh, me, j - 1); to != kNoRank) {
      std::copy(grad.begin(), grad.end(), message.begin());
      comm.SendRecv(Bytes(message), to, {}, kNoRank, Group::kCp);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Ring attention.

namespace {

// Local segment k of a [batch, seq, heads, dim] tensor (seq = segs * len), as a dense
// [batch, len, heads, dim] piece, and back.
struct Pieces {
  int64_t batch, seq, len;
  void Extract(float* piece, const float* full, int64_t k, int64_t row) const {
    for (int64_t b = 0; b < batch; ++b) {
      std::copy_n(full + (b * seq + k * len) * row, len * row, piece + b * len * row);
    }
  }
  template <typename T>
  void Insert(float* full, const T* piece, int64_t k, int64_t row) const {
    for (int64_t b = 0; b < batch; ++b) {
      std::copy_n(piece + b * len * row, len * row, full + (b * seq + k * len) * row);
    }
  }
  // lse is [batch, heads, seq]: a piece is [batch, heads, len].
  void ExtractLse(float* piece, const float* full, int64_t k, int64_t heads) const {
    for (int64_t bh = 0; bh < batch * heads; ++bh) {
      std::copy_n(full + bh * seq + k * len, len, piece + bh * len);
    }
  }
  template <typename T>
  void InsertLse(float* full, const T* piece, int64_t k, int64_t heads) const {
    for (int64_t bh = 0; bh < batch * heads; ++bh) {
      std::copy_n(piece + bh * len, len, full + bh * seq + k * len);
    }
  }
  // positions [batch, seq] (or null): segment k's [batch, len], empty for none.
  std::vector<int32_t> Positions(const int32_t* full, int64_t k) const {
    std::vector<int32_t> piece;
    if (full == nullptr) return piece;
    for (int64_t b = 0; b < batch; ++b) {
      piece.insert(piece.end(), full + b * seq + k * len, full + b * seq + (k + 1) * len);
    }
    return piece;
  }
};

const int32_t* OrNull(const std::vector<int32_t>& v) { return v.empty() ? nullptr : v.data(); }

}  // namespace

void ring_attention_forward(comm::Communicator& comm, const plan::Mesh& mesh, float* out,
                            float* lse, const float* q, const float* k, const float* v,
                            const AttentionShape& shape, float scale, bool causal,
                            const int32_t* positions) {
  const int64_t cp = mesh.cp, me = comm.cp_index(), segs = mesh.segments_per_rank();
  const int64_t B = shape.batch, S = shape.q_len, len = S / segs, Hq = shape.q_heads,
                Hkv = shape.kv_heads, D = shape.head_dim;
  const Pieces pieces{B, S, len};
  const AttentionShape piece_shape{B, len, len, Hq, Hkv, D};
  const int64_t q_piece = B * len * Hq * D, kv_piece = B * len * Hkv * D, lse_piece = B * Hq * len;
  const int64_t kv_count = B * S * Hkv * D;

  // The local queries by segment, and each segment's merged result so far (empty: lse = -inf).
  std::vector<std::vector<float>> qs(segs, std::vector<float>(q_piece));
  std::vector<std::vector<double>> acc_out(segs, std::vector<double>(q_piece, 0.0));
  std::vector<std::vector<double>> acc_lse(
      segs, std::vector<double>(lse_piece, -std::numeric_limits<double>::infinity()));
  std::vector<std::vector<int32_t>> qpos(segs);
  for (int64_t kq = 0; kq < segs; ++kq) {
    pieces.Extract(qs[kq].data(), q, kq, Hq * D);
    qpos[kq] = pieces.Positions(positions, kq);
  }

  // The K/V block in hand, [k | v] as stored locally; it starts as this rank's own.
  std::vector<float> block(2 * kv_count), incoming(2 * kv_count);
  std::copy_n(k, kv_count, block.begin());
  std::copy_n(v, kv_count, block.begin() + kv_count);

  std::vector<float> kp(kv_piece), vp(kv_piece), part_out(q_piece), part_lse(lse_piece);
  std::vector<double> part_out_d(q_piece), part_lse_d(lse_piece);
  for (int64_t step = 0; step < cp; ++step) {
    const int64_t source = (me - step + cp) % cp;  // whose K/V is in hand
    for (const comm::SegmentPair& p : VisiblePairs(mesh, me, source, len, causal)) {
      pieces.Extract(kp.data(), block.data(), p.kk, Hkv * D);
      pieces.Extract(vp.data(), block.data() + kv_count, p.kk, Hkv * D);
      attention_forward<float>(part_out.data(), part_lse.data(), qs[p.kq].data(), kp.data(),
                               vp.data(), piece_shape, scale, causal, p.q_pos0, p.k_pos0,
                               OrNull(qpos[p.kq]));
      std::copy(part_out.begin(), part_out.end(), part_out_d.begin());
      std::copy(part_lse.begin(), part_lse.end(), part_lse_d.begin());
      attention_merge<double>(acc_out[p.kq].data(), acc_lse[p.kq].data(), part_out_d.data(),
                              part_lse_d.data(), B, len, Hq, D);
    }
    if (step + 1 < cp) {  // pass the block on: to the next rank, from the previous one
      comm.SendRecv(Bytes(block), static_cast<int>((me + 1) % cp), Bytes(incoming),
                    static_cast<int>((me - 1 + cp) % cp), Group::kCp);
      std::swap(block, incoming);
    }
  }
  for (int64_t kq = 0; kq < segs; ++kq) {
    pieces.Insert(out, acc_out[kq].data(), kq, Hq * D);
    pieces.InsertLse(lse, acc_lse[kq].data(), kq, Hq);
  }
}

void ring_attention_backward(comm::Communicator& comm, const plan::Mesh& mesh, float* dq, float* dk,
                             float* dv, const float* dout, const float* q, const float* k,
                             const float* v, const float* out, const float* lse,
                             const AttentionShape& shape, float scale, bool causal,
                             const int32_t* positions) {
  const int64_t cp = mesh.cp, me = comm.cp_index(), segs = mesh.segments_per_rank();
  const int64_t B = shape.batch, S = shape.q_len, len = S / segs, Hq = shape.q_heads,
                Hkv = shape.kv_heads, D = shape.head_dim;
  const Pieces pieces{B, S, len};
  const AttentionShape piece_shape{B, len, len, Hq, Hkv, D};
  const int64_t q_piece = B * len * Hq * D, kv_piece = B * len * Hkv * D, lse_piece = B * Hq * len;
  const int64_t kv_count = B * S * Hkv * D;

  // What stays: the queries' side, by segment.
  struct QuerySide {
    std::vector<float> q, dout, out, lse;
    std::vector<double> dq;
    std::vector<int32_t> positions;  // empty: one document
  };
  std::vector<QuerySide> side(segs);
  for (int64_t kq = 0; kq < segs; ++kq) {
    QuerySide& s = side[kq];
    s.q.resize(q_piece);
    s.dout.resize(q_piece);
    s.out.resize(q_piece);
    s.lse.resize(lse_piece);
    s.dq.assign(q_piece, 0.0);
    pieces.Extract(s.q.data(), q, kq, Hq * D);
    pieces.Extract(s.dout.data(), dout, kq, Hq * D);
    pieces.Extract(s.out.data(), out, kq, Hq * D);
    pieces.ExtractLse(s.lse.data(), lse, kq, Hq);
    s.positions = pieces.Positions(positions, kq);
  }

  // What travels: [k | v | dk | dv] of one rank's block, the gradients accumulated on the way.
  std::vector<float> block(4 * kv_count, 0.0f), incoming(4 * kv_count);
  std::copy_n(k, kv_count, block.begin());
  std::copy_n(v, kv_count, block.begin() + kv_count);

  std::vector<float> kp(kv_piece), vp(kv_piece), dkp(kv_piece), dvp(kv_piece), dqp(q_piece);
  for (int64_t step = 0; step < cp; ++step) {
    const int64_t source = (me - step + cp) % cp;
    float* block_dk = block.data() + 2 * kv_count;
    float* block_dv = block.data() + 3 * kv_count;
    for (const comm::SegmentPair& p : VisiblePairs(mesh, me, source, len, causal)) {
      QuerySide& s = side[p.kq];
      pieces.Extract(kp.data(), block.data(), p.kk, Hkv * D);
      pieces.Extract(vp.data(), block.data() + kv_count, p.kk, Hkv * D);
      attention_backward<float>(dqp.data(), dkp.data(), dvp.data(), s.dout.data(), s.q.data(),
                                kp.data(), vp.data(), s.out.data(), s.lse.data(), piece_shape,
                                scale, causal, p.q_pos0, p.k_pos0, OrNull(s.positions));
      for (int64_t i = 0; i < q_piece; ++i) s.dq[i] += static_cast<double>(dqp[i]);
      // Add this pair's share into the block's dK/dV rows of key segment kk.
      for (int64_t b = 0; b < B; ++b) {
        const int64_t row = Hkv * D, from = b * len * row, to = (b * S + p.kk * len) * row;
        for (int64_t i = 0; i < len * row; ++i) {
          block_dk[to + i] += dkp[from + i];
          block_dv[to + i] += dvp[from + i];
        }
      }
    }
    const int next = static_cast<int>((me + 1) % cp),
              previous = static_cast<int>((me - 1 + cp) % cp);
    if (step + 1 < cp) {
      comm.SendRecv(Bytes(block), next, Bytes(incoming), previous, Group::kCp);
      std::swap(block, incoming);
    } else if (cp > 1) {
      // The block in hand is rank me+1's (source = me - (cp-1)): its gradients go home, and
      // this rank's own come from rank me-1. Only dK/dV travel this time.
      std::span<const std::byte> grads =
          std::as_bytes(std::span(block).subspan(2 * kv_count, 2 * kv_count));
      std::span<std::byte> mine =
          std::as_writable_bytes(std::span(incoming).subspan(2 * kv_count, 2 * kv_count));
      comm.SendRecv(grads, next, mine, previous, Group::kCp);
      std::swap(block, incoming);
    }
  }
  // `block` now holds this rank's own dK/dV.
  std::copy_n(block.begin() + 2 * kv_count, kv_count, dk);
  std::copy_n(block.begin() + 3 * kv_count, kv_count, dv);
  for (int64_t kq = 0; kq < segs; ++kq) pieces.Insert(dq, side[kq].dq.data(), kq, Hq * D);
}

// ---------------------------------------------------------------------------------------------

void all_reduce(comm::Communicator& comm, float* y, const float* x, int64_t n, comm::Group group) {
  std::vector<double> sum(x, x + n);
  comm.AllReduceSum(sum.data(), n, group);
  std::copy(sum.begin(), sum.end(), y);
}

// ---------------------------------------------------------------------------------------------
// Expert parallelism.

namespace {

// The routes of this layer's slots (collective over kEp) and, for an expert id outside [0, E),
// the error every rank's step then reports (such a slot stays home and contributes nothing).
struct MoeRouting {
  comm::ExpertRoutes routes;
  absl::Status status;
};
MoeRouting RouteSlots(comm::Communicator& comm, const int32_t* experts, const MoeShape& s) {
  MoeRouting r{comm::RouteToExpertOwners(comm, std::span(experts, s.tokens * s.k), s.experts, s.ep),
               absl::OkStatus()};
  if (const int64_t bad = r.routes.bad_slot; bad >= 0) {
    r.status = absl::InvalidArgumentError(absl::StrFormat(
        "expert index %d at position %d is outside [0, %d)", experts[bad], bad, s.experts));
  }
  return r;
}

// A 4-byte word of a record: the bits of an int32 or a float.
float WordOf(int32_t value) {
  float word;
  std::memcpy(&word, &value, sizeof(word));
  return word;
}
int32_t IntOf(float word) {
  int32_t value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

}  // namespace

absl::Status moe_experts_ep_forward(comm::Communicator& comm, float* out, const float* x,
                                    const float* gates, const int32_t* experts, const float* w_in,
                                    const float* w_out, const MoeShape& s) {
  const int64_t H = s.hidden, I = s.inner, per_rank = s.experts / s.ep;
  const MoeRouting routing = RouteSlots(comm, experts, s);
  const comm::ExpertRoutes& route = routing.routes;

  // Out: (its expert, counted from the owner's first; x[t]) per slot, 1 + H words.
  const int64_t record = 1 + H;
  std::vector<float> send(static_cast<size_t>(route.order.size() * record));
  for (size_t at = 0; at < route.order.size(); ++at) {
    const int64_t slot = route.order[at], t = slot / s.k;
    float* rec = send.data() + at * record;
    rec[0] = WordOf(route.local_expert[at]);
    std::copy_n(x + t * H, H, rec + 1);
  }
  const int64_t received = route.received();
  std::vector<float> recv(static_cast<size_t>(received * record));
  comm.AllToAllV(Bytes(send), route.SendCounts(record * sizeof(float)), Bytes(recv),
                 route.RecvCounts(record * sizeof(float)), Group::kEp);

  // The local experts on every slot that arrived: one row per slot, gate 1, so the result is the
  // expert's output o itself, in double.
  std::vector<double> xs(received * H), ones(received, 1.0), o(received * H);
  std::vector<int32_t> local(received);
  for (int64_t i = 0; i < received; ++i) {
    const float* rec = recv.data() + i * record;
    local[i] = IntOf(rec[0]);
    std::copy_n(rec + 1, H, xs.begin() + i * H);
  }
  const std::vector<double> w_in_d(w_in, w_in + per_rank * 2 * I * H),
      w_out_d(w_out, w_out + per_rank * H * I);
  moe_experts_forward<double>(o.data(), xs.data(), ones.data(), local.data(), w_in_d.data(),
                              w_out_d.data(), received, H, I, per_rank, /*k=*/1);

  // Back: o per slot, in the order the slots came; they return in the order they were sent.
  std::vector<double> back(route.order.size() * H);
  comm.AllToAllV(Bytes(o), route.RecvCounts(H * sizeof(double)), Bytes(back),
                 route.SendCounts(H * sizeof(double)), Group::kEp);

  // Combine as moe_experts_forward: acc = sum_j gate * o in double, slot order, one rounding.
  std::vector<double> acc(H);
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < s.k; ++j) {
      const int64_t at = route.position[t * s.k + j];
      if (at < 0) continue;
      const double gate = static_cast<double>(gates[t * s.k + j]);
      const double* oj = back.data() + at * H;
      for (int64_t r = 0; r < H; ++r) acc[r] += gate * oj[r];
    }
    for (int64_t r = 0; r < H; ++r) out[t * H + r] = static_cast<float>(acc[r]);
  }
  return routing.status;
}

absl::Status moe_experts_ep_backward(comm::Communicator& comm, float* dx, float* dgates,
                                     float* dw_in, float* dw_out, const float* dout, const float* x,
                                     const float* gates, const int32_t* experts, const float* w_in,
                                     const float* w_out, const MoeShape& s) {
  const int64_t H = s.hidden, I = s.inner, per_rank = s.experts / s.ep;
  const MoeRouting routing = RouteSlots(comm, experts, s);
  const comm::ExpertRoutes& route = routing.routes;

  // Out: (its owner's expert index, gate, x[t], dout[t]) per slot, 2 + 2H words.
  const int64_t record = 2 + 2 * H;
  std::vector<float> send(static_cast<size_t>(route.order.size() * record));
  for (size_t at = 0; at < route.order.size(); ++at) {
    const int64_t slot = route.order[at], t = slot / s.k;
    float* rec = send.data() + at * record;
    rec[0] = WordOf(route.local_expert[at]);
    rec[1] = gates[slot];
    std::copy_n(x + t * H, H, rec + 2);
    std::copy_n(dout + t * H, H, rec + 2 + H);
  }
  const int64_t received = route.received();
  std::vector<float> recv(static_cast<size_t>(received * record));
  comm.AllToAllV(Bytes(send), route.SendCounts(record * sizeof(float)), Bytes(recv),
                 route.RecvCounts(record * sizeof(float)), Group::kEp);

  // The local experts' backward on the slots that arrived (one row each, k = 1), in double.
  std::vector<double> xs(received * H), douts(received * H), gs(received), dxs(received * H),
      dgs(received);
  std::vector<int32_t> local(received);
  for (int64_t i = 0; i < received; ++i) {
    const float* rec = recv.data() + i * record;
    local[i] = IntOf(rec[0]);
    gs[i] = rec[1];
    std::copy_n(rec + 2, H, xs.begin() + i * H);
    std::copy_n(rec + 2 + H, H, douts.begin() + i * H);
  }
  const std::vector<double> w_in_d(w_in, w_in + per_rank * 2 * I * H),
      w_out_d(w_out, w_out + per_rank * H * I);
  std::vector<double> dw_in_d(w_in_d.size()), dw_out_d(w_out_d.size());
  moe_experts_backward<double>(dxs.data(), dgs.data(), dw_in_d.data(), dw_out_d.data(),
                               douts.data(), xs.data(), gs.data(), local.data(), w_in_d.data(),
                               w_out_d.data(), received, H, I, per_rank, /*k=*/1);
  std::copy(dw_in_d.begin(), dw_in_d.end(), dw_in);
  std::copy(dw_out_d.begin(), dw_out_d.end(), dw_out);

  // Back: (dgate, dx share) per slot, 1 + H doubles.
  const int64_t back_record = 1 + H;
  std::vector<double> reply(received * back_record);
  for (int64_t i = 0; i < received; ++i) {
    reply[i * back_record] = dgs[i];
    std::copy_n(dxs.begin() + i * H, H, reply.begin() + i * back_record + 1);
  }
  std::vector<double> back(route.order.size() * back_record);
  comm.AllToAllV(Bytes(reply), route.RecvCounts(back_record * sizeof(double)), Bytes(back),
                 route.SendCounts(back_record * sizeof(double)), Group::kEp);

  // dgates per slot; dx sums a token's shares in ascending expert order, in double.
  std::vector<double> acc(H);
  std::vector<int64_t> by_expert(s.k);
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::iota(by_expert.begin(), by_expert.end(), int64_t{0});
    std::stable_sort(by_expert.begin(), by_expert.end(), [&](int64_t a, int64_t b) {
      return experts[t * s.k + a] < experts[t * s.k + b];
    });
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j : by_expert) {
      const int64_t at = route.position[t * s.k + j];
      dgates[t * s.k + j] = at < 0 ? 0.0f : static_cast<float>(back[at * back_record]);
      if (at < 0) continue;
      const double* share = back.data() + at * back_record + 1;
      for (int64_t r = 0; r < H; ++r) acc[r] += share[r];
    }
    for (int64_t r = 0; r < H; ++r) dx[t * H + r] = static_cast<float>(acc[r]);
  }
  return routing.status;
}

}  // namespace hcp::cpu
