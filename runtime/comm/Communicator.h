// Communicators: how the ranks of a plan's mesh talk to each other (context and data parallelism
// on CPU ranks). The collectives of KernelTable.txt (runtime/backends/cpu/Collectives.h) are
// written against this interface only.
//
// Ranks and groups. world = dp * cp ranks; world rank = dp_index * cp + cp_index. A group is a
// set of ranks that communicate together; each member has a group rank 0..size(group)-1:
//   kWorld: every rank; group rank = world rank.
//   kCp:    the cp ranks of one sequence (same dp_index); group rank = cp_index.
//   kDp:    the ranks holding the same shard of other sequences (same cp_index); group
//           rank = dp_index.
//   kEp:    expert parallelism: the ep consecutive world ranks of this rank's ep group
//           (world_rank / ep); group rank = the expert index ep_index() = world_rank % ep. The
//           experts of every MoE layer are split over them.
//   kEpReplica: the ranks with this rank's expert index, one per ep group: they hold copies of
//           the same experts; group rank = world_rank / ep. (ep = 1: every rank, the world.)
// Every method that communicates takes a group and speaks in group ranks. WorldRank() is the one
// place where a group rank becomes a world rank.
//
// Failure. Every rank of a group must call the same collectives on it, in the same order, with
// the same sizes; a rank that skips one leaves the others waiting forever. So the methods here
// never return an error a peer would not also see: a misuse (sizes that do not fit, a rank
// outside the group) is a bug and aborts the whole job through Abort() with a message, and MPI's
// own errors are fatal (MPI_ERRORS_ARE_FATAL: MPI aborts every rank of the job). Errors of one
// rank's own work are shared with AgreeOnStatus (Agreement.h) before anyone relies on them.
// A rank that dies (a crash, a kill) is noticed by mpirun, which then kills every other rank of
// the job. A rank that stops answering (stopped, deadlocked, or gone without its process ending)
// is caught by the timeout: a collective or message that has not completed timeout() after it
// began ends the whole job through Abort(), with a message naming this rank, the collective, its
// group and, when they can be known, the peers that did not answer; MPI_Finalize at the end,
// which waits for every rank, has the same deadline (MpiSession). (MPI's communicator creation,
// MPI_Comm_dup and MPI_Comm_split at startup, has none: it follows right after the startup
// agreement's all-gathers, which do.)
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "runtime/plan/Plan.h"

namespace hcp::comm {

// The first three are the all_reduce kernel's group int.
enum class Group : uint8_t { kWorld = 0, kCp = 1, kDp = 2, kEp = 3, kEpReplica = 4 };
std::string_view GroupName(Group group);  // "world", "cp", "dp", "ep", "ep replica"

// "No peer" for SendRecv: nothing is sent, or nothing received.
inline constexpr int kNoRank = -1;

// How long a collective waits for its peers unless told otherwise (the commands' --timeout).
inline constexpr std::chrono::seconds kDefaultTimeout{300};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

  // How long one collective or message may wait for the other ranks before the job is ended.
  std::chrono::seconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::seconds timeout) { timeout_ = timeout; }

  // The mesh set by SetMesh (or given at construction). Until then only kWorld can be used.
  bool has_mesh() const { return mesh_.has_value(); }
  const plan::Mesh& mesh() const;
  int cp_index() const { return world_rank_ % static_cast<int>(mesh().cp); }
  int dp_index() const { return world_rank_ / static_cast<int>(mesh().cp); }
  // The expert index: which 1/ep of the experts this rank holds.
  int ep_index() const { return world_rank_ % static_cast<int>(mesh().ep); }
  // This rank's group rank, and the group's size.
  int rank(Group group) const;
  int size(Group group) const;
  // The world rank of `group_rank` in this rank's `group`. The only group-to-world translation.
  int WorldRank(Group group, int group_rank) const;

  // Splits the world into cp, dp, ep and ep-replica groups. Collective over the world: every
  // rank calls it with the same mesh, whose cp * dp must equal world_size() and be divisible by
  // its ep (otherwise InvalidArgument, the same on every rank, before any communication).
  // CheckRanksAgree (Agreement.h) makes sure both hold before it calls this.
  absl::Status SetMesh(const plan::Mesh& mesh);

  // In place: data[i] = sum over the group's ranks of their data[i]. n the same on every rank.
  void AllReduceSum(float* data, int64_t n, Group group);
  void AllReduceSum(double* data, int64_t n, Group group);
  // recv = the send bytes of every group rank, concatenated in group rank order. send.size()
  // must be the same on every rank and recv.size() = size(group) * send.size().
  void AllGather(std::span<const std::byte> send, std::span<std::byte> recv, Group group);
  // Sends `send` to group rank `dest` and receives exactly recv.size() bytes from group rank
  // `source`, both at once, so a shift where every rank sends to its neighbour cannot deadlock.
  // Either may be kNoRank (send or receive nothing). The peer must make the matching call.
  // Messages between two ranks arrive in the order they were sent.
  void SendRecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv, int source,
                Group group);
  // All-to-all with per-peer sizes: `send` holds send_bytes[p] bytes for each group rank p,
  // concatenated in group rank order; `recv` gets recv_bytes[p] bytes from each group rank p,
  // concatenated the same way. Both lists have size(group) entries (zeros allowed) adding up to
  // the span's size, and recv_bytes[p] must be what p sends to this rank (exchange the counts
  // first with AllToAll). Every rank of the group calls it, even with nothing to send.
  void AllToAllV(std::span<const std::byte> send, std::span<const int64_t> send_bytes,
                 std::span<std::byte> recv, std::span<const int64_t> recv_bytes, Group group);
  // Equal blocks: send.size() = recv.size() = size(group) * block; block p of `send` goes to
  // group rank p, and block p of `recv` comes from it.
  void AllToAll(std::span<const std::byte> send, std::span<std::byte> recv, Group group);
  void Barrier(Group group);

  // What this rank handed the transport for OTHER ranks, in bytes, by traffic label: the label
  // set last (SetTrafficLabel; "unlabelled" before any) names what the following calls send. An
  // all-reduce over n ranks counts 2 (n-1)/n of its data, what a ring all-reduce sends; the other
  // collectives count exactly what leaves the rank. plan::BytesSentPerRank predicts these
  // figures from a plan (`hybridcp inspect`); `run-step --traffic` holds it to them.
  void SetTrafficLabel(std::string_view label) { traffic_label_ = label; }
  const std::string& traffic_label() const { return traffic_label_; }
  const std::map<std::string, uint64_t, std::less<>>& bytes_sent() const { return bytes_sent_; }
  void ResetTraffic() { bytes_sent_.clear(); }

  // Ends the whole job now with `status`'s message ("rank 3: error: ..."): every rank exits
  // non-zero. For errors on one rank that the others cannot know about.
  [[noreturn]] virtual void Abort(const absl::Status& status) = 0;

 protected:
  Communicator(int world_rank, int world_size) : world_rank_(world_rank), world_size_(world_size) {}

  // The transport, in world ranks (kNoRank passes through). Sizes are already checked.
  virtual absl::Status DoSetMesh(const plan::Mesh& mesh) = 0;
  virtual void DoAllReduceSum(float* data, int64_t n, Group group) = 0;
  virtual void DoAllReduceSum(double* data, int64_t n, Group group) = 0;
  virtual void DoAllGather(std::span<const std::byte> send, std::span<std::byte> recv,
                           Group group) = 0;
  virtual void DoSendRecv(std::span<const std::byte> send, int world_dest,
                          std::span<std::byte> recv, int world_source) = 0;
  // Per peer i: send_bytes[i] bytes (at the running sum of the sizes before it) to
  // world_ranks[i], and recv_bytes[i] from it, likewise. world_ranks[i] is the group's rank i;
  // this rank is among them. Sizes are checked.
  virtual void DoAllToAllV(std::span<const std::byte> send, std::span<const int64_t> send_bytes,
                           std::span<std::byte> recv, std::span<const int64_t> recv_bytes,
                           std::span<const int> world_ranks) = 0;
  virtual void DoBarrier(Group group) = 0;

  // Abort() for a bug in the caller: "communicator misuse: <what>".
  [[noreturn]] void Misuse(const std::string& what);

 private:
  void CountSent(uint64_t bytes);
  template <typename T>
  void CountAllReduce(int64_t n, Group group);

  int world_rank_;
  int world_size_;
  std::chrono::seconds timeout_ = kDefaultTimeout;
  std::optional<plan::Mesh> mesh_;
  std::string traffic_label_ = "unlabelled";
  std::map<std::string, uint64_t, std::less<>> bytes_sent_;
};

// One rank (no MPI): every group is this rank alone and every collective is the identity;
// SendRecv can only address this rank itself (a copy) or kNoRank. The mesh is cp=1 x dp=1,
// ep=1.
class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator();
  [[noreturn]] void Abort(const absl::Status& status) override;

 protected:
  absl::Status DoSetMesh(const plan::Mesh& mesh) override;
  void DoAllReduceSum(float* data, int64_t n, Group group) override {}
  void DoAllReduceSum(double* data, int64_t n, Group group) override {}
  void DoAllGather(std::span<const std::byte> send, std::span<std::byte> recv,
                   Group group) override;
  void DoSendRecv(std::span<const std::byte> send, int world_dest, std::span<std::byte> recv,
                  int world_source) override;
  void DoAllToAllV(std::span<const std::byte> send, std::span<const int64_t> send_bytes,
                   std::span<std::byte> recv, std::span<const int64_t> recv_bytes,
                   std::span<const int> world_ranks) override;
  void DoBarrier(Group group) override {}
};

}  // namespace hcp::comm
