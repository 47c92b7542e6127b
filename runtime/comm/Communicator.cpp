#include "runtime/comm/Communicator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/support/Status.h"

namespace hcp::comm {

std::string_view GroupName(Group group) {
  switch (group) {
    case Group::kWorld:
      return "world";
    case Group::kCp:
      return "cp";
    case Group::kDp:
      return "dp";
    case Group::kEp:
      return "ep";
    case Group::kEpReplica:
      return "ep replica";
  }
  return "?";
}

const plan::Mesh& Communicator::mesh() const {
  if (!mesh_) const_cast<Communicator*>(this)->Misuse("the mesh is used before SetMesh");
  return *mesh_;
}

int Communicator::rank(Group group) const {
  switch (group) {
    case Group::kWorld:
      return world_rank_;
    case Group::kCp:
      return cp_index();
    case Group::kDp:
      return dp_index();
    case Group::kEp:
      return ep_index();
    case Group::kEpReplica:
      return world_rank_ / static_cast<int>(mesh().ep);
  }
  return 0;
}

int Communicator::size(Group group) const {
  switch (group) {
    case Group::kWorld:
      return world_size_;
    case Group::kCp:
      return static_cast<int>(mesh().cp);
    case Group::kDp:
      return static_cast<int>(mesh().dp);
    case Group::kEp:
      return static_cast<int>(mesh().ep);
    case Group::kEpReplica:
      return world_size_ / static_cast<int>(mesh().ep);
  }
  return 0;
}

int Communicator::WorldRank(Group group, int group_rank) const {
  if (group_rank == kNoRank) return kNoRank;
  if (group_rank < 0 || group_rank >= size(group)) {
    const_cast<Communicator*>(this)->Misuse(absl::StrFormat(
        "rank %d is outside the %s group of %d ranks", group_rank, GroupName(group), size(group)));
  }
  const int cp = group == Group::kWorld ? 1 : static_cast<int>(mesh().cp);
  switch (group) {
    case Group::kWorld:
      return group_rank;
    case Group::kCp:  // same dp_index
      return dp_index() * cp + group_rank;
    case Group::kDp:  // same cp_index
      return group_rank * cp + cp_index();
    case Group::kEp: {  // the same block of ep consecutive ranks
      const int ep = static_cast<int>(mesh().ep);
      return world_rank_ / ep * ep + group_rank;
    }
    case Group::kEpReplica:  // same expert index
      return group_rank * static_cast<int>(mesh().ep) + ep_index();
  }
  return kNoRank;
}

absl::Status Communicator::SetMesh(const plan::Mesh& mesh) {
  if (mesh.cp < 1 || mesh.dp < 1 || mesh.cp * mesh.dp != world_size_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the plan was compiled for cp=%d x dp=%d = %d ranks, but %d rank%s started", mesh.cp,
        mesh.dp, mesh.cp * mesh.dp, world_size_, world_size_ == 1 ? " was" : "s were"));
  }
  if (mesh.ep < 1 || world_size_ % mesh.ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the plan's ep=%d does not divide its %d ranks", mesh.ep, world_size_));
  }
  HCP_RETURN_IF_ERROR(DoSetMesh(mesh));
  mesh_ = mesh;
  return absl::OkStatus();
}

void Communicator::CountSent(uint64_t bytes) {
  if (bytes > 0) bytes_sent_[traffic_label_] += bytes;
}

// A ring all-reduce over k ranks sends 2 (k-1)/k of the data from each.
template <typename T>
void Communicator::CountAllReduce(int64_t n, Group group) {
  const auto k = static_cast<uint64_t>(size(group));  // also checks the mesh for kCp and kDp
  if (k > 1) CountSent(2 * static_cast<uint64_t>(n) * sizeof(T) * (k - 1) / k);
}

void Communicator::AllReduceSum(float* data, int64_t n, Group group) {
  if (n < 0) Misuse(absl::StrFormat("all-reduce of %d values", n));
  CountAllReduce<float>(n, group);
  DoAllReduceSum(data, n, group);
}

void Communicator::AllReduceSum(double* data, int64_t n, Group group) {
  if (n < 0) Misuse(absl::StrFormat("all-reduce of %d values", n));
  CountAllReduce<double>(n, group);
  DoAllReduceSum(data, n, group);
}

void Communicator::AllGather(std::span<const std::byte> send, std::span<std::byte> recv,
                             Group group) {
  const size_t want = send.size() * static_cast<size_t>(size(group));
  if (recv.size() != want) {
    Misuse(absl::StrFormat("all-gather of %d bytes over %d ranks into %d bytes", send.size(),
                           size(group), recv.size()));
  }
  CountSent(send.size() * static_cast<uint64_t>(size(group) - 1));
  DoAllGather(send, recv, group);
}

void Communicator::SendRecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv,
                            int source, Group group) {
  const int world_dest = WorldRank(group, dest);
  const int world_source = WorldRank(group, source);
  if (dest != kNoRank && world_dest != world_rank_) CountSent(send.size());
  DoSendRecv(dest == kNoRank ? std::span<const std::byte>() : send, world_dest,
             source == kNoRank ? std::span<std::byte>() : recv, world_source);
}

void Communicator::AllToAllV(std::span<const std::byte> send, std::span<const int64_t> send_bytes,
                             std::span<std::byte> recv, std::span<const int64_t> recv_bytes,
                             Group group) {
  const int n = size(group);
  if (static_cast<int>(send_bytes.size()) != n || static_cast<int>(recv_bytes.size()) != n) {
    Misuse(
        absl::StrFormat("all-to-all over the %s group of %d ranks with %d send and %d receive "
                        "sizes",
                        GroupName(group), n, send_bytes.size(), recv_bytes.size()));
  }
  int64_t sent = 0, received = 0;
  for (int p = 0; p < n; ++p) {
    if (send_bytes[p] < 0 || recv_bytes[p] < 0) {
      Misuse(absl::StrFormat("all-to-all with a negative size for group rank %d", p));
    }
    sent += send_bytes[p];
    received += recv_bytes[p];
  }
  if (sent != static_cast<int64_t>(send.size()) || received != static_cast<int64_t>(recv.size())) {
    Misuse(absl::StrFormat(
        "all-to-all sizes add up to %d bytes sent and %d received, but the buffers hold %d and %d",
        sent, received, send.size(), recv.size()));
  }
  std::vector<int> world_ranks(n);
  for (int p = 0; p < n; ++p) world_ranks[p] = WorldRank(group, p);
  CountSent(static_cast<uint64_t>(sent - send_bytes[rank(group)]));
  DoAllToAllV(send, send_bytes, recv, recv_bytes, world_ranks);
}

void Communicator::AllToAll(std::span<const std::byte> send, std::span<std::byte> recv,
                            Group group) {
  const int n = size(group);
  if (send.size() != recv.size() || send.size() % static_cast<size_t>(n) != 0) {
    Misuse(absl::StrFormat("all-to-all of %d bytes into %d bytes over %d ranks", send.size(),
                           recv.size(), n));
  }
  const std::vector<int64_t> blocks(n, static_cast<int64_t>(send.size() / n));
  AllToAllV(send, blocks, recv, blocks, group);
}

void Communicator::Barrier(Group group) {
  size(group);
  DoBarrier(group);
}

void Communicator::Misuse(const std::string& what) {
  Abort(absl::InternalError("communicator misuse (a bug): " + what));
  std::abort();  // not reached: Abort does not return (the compiler cannot see through virtual)
}

// ---------------------------------------------------------------------------------------------

LocalCommunicator::LocalCommunicator() : Communicator(/*world_rank=*/0, /*world_size=*/1) {
  // Cannot fail: cp = dp = 1 is one rank.
  (void)SetMesh(plan::Mesh{});
}

void LocalCommunicator::Abort(const absl::Status& status) {
  std::fprintf(stderr, "%s\n", FormatError(status).c_str());
  std::fflush(stderr);
  std::abort();
}

absl::Status LocalCommunicator::DoSetMesh(const plan::Mesh& mesh) { return absl::OkStatus(); }

void LocalCommunicator::DoAllGather(std::span<const std::byte> send, std::span<std::byte> recv,
                                    Group group) {
  if (!send.empty()) std::memcpy(recv.data(), send.data(), send.size());
}

void LocalCommunicator::DoSendRecv(std::span<const std::byte> send, int world_dest,
                                   std::span<std::byte> recv, int world_source) {
  // Only rank 0 exists: a message to itself is a copy, and both ends must be there.
  if ((world_dest == 0) != (world_source == 0) || send.size() != recv.size()) {
    Misuse(absl::StrFormat("one rank sends %d bytes to rank %d and receives %d from rank %d",
                           send.size(), world_dest, recv.size(), world_source));
  }
  if (!send.empty()) std::memmove(recv.data(), send.data(), send.size());
}

void LocalCommunicator::DoAllToAllV(std::span<const std::byte> send,
                                    std::span<const int64_t> send_bytes, std::span<std::byte> recv,
                                    std::span<const int64_t> recv_bytes,
                                    std::span<const int> world_ranks) {
  // One rank: the group is this rank, and what it sends itself is what it receives.
  if (send_bytes[0] != recv_bytes[0]) {
    Misuse(absl::StrFormat("one rank sends itself %d bytes but expects %d", send_bytes[0],
                           recv_bytes[0]));
  }
  if (!send.empty()) std::memmove(recv.data(), send.data(), send.size());
}

}  // namespace hcp::comm
