// Communicators: how the ranks of a plan's mesh talk to each other (context and data parallelism
// on CPU ranks). The collectives of KernelTable.def (runtime/backends/cpu/DistKernels.h) are
// written against this interface only.
//
// Ranks and groups. world = dp * cp ranks; world rank = dp_index * cp + cp_index. A group is a
// set of ranks that communicate together; each member has a group rank 0..size(group)-1:
//   kWorld: every rank; group rank = world rank.
//   kCp:    the cp ranks of one sequence (same dp_index); group rank = cp_index.
//   kDp:    the ranks holding the same shard of other sequences (same cp_index); group
//           rank = dp_index.
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
// the job; a rank that hangs outside MPI is only caught by a job time limit (mpirun --timeout N,
// or MPIEXEC_TIMEOUT=N).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "runtime/plan/Plan.h"

namespace hcp::comm {

// Same numbers as the all_reduce kernel's group int.
enum class Group : uint8_t { kWorld = 0, kCp = 1, kDp = 2 };
std::string_view GroupName(Group group);  // "world", "cp", "dp"

// "No peer" for SendRecv: nothing is sent, or nothing received.
inline constexpr int kNoRank = -1;

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

  // The mesh set by SetMesh (or given at construction). Until then only kWorld can be used.
  bool has_mesh() const { return mesh_.has_value(); }
  const plan::Mesh& mesh() const;
  int cp_index() const { return world_rank_ % static_cast<int>(mesh().cp); }
  int dp_index() const { return world_rank_ / static_cast<int>(mesh().cp); }
  // This rank's group rank, and the group's size.
  int rank(Group group) const;
  int size(Group group) const;
  // The world rank of `group_rank` in this rank's `group`. The only group-to-world translation.
  int WorldRank(Group group, int group_rank) const;

  // Splits the world into cp and dp groups. Collective over the world: every rank calls it
  // with the same mesh, whose cp * dp must equal world_size() (otherwise InvalidArgument, the
  // same on every rank, before any communication). CheckRanksAgree (Agreement.h) makes sure
  // both hold before it calls this.
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
  void Barrier(Group group);

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
  virtual void DoBarrier(Group group) = 0;

  // Abort() for a bug in the caller: "communicator misuse: <what>".
  [[noreturn]] void Misuse(const std::string& what);

 private:
  int world_rank_;
  int world_size_;
  std::optional<plan::Mesh> mesh_;
};

// One rank (no MPI): every group is this rank alone and every collective is the identity;
// SendRecv can only address this rank itself (a copy) or kNoRank. The mesh is cp=1 x dp=1.
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
  void DoBarrier(Group group) override {}
};

}  // namespace hcp::comm
