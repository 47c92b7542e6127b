#include "runtime/comm/Communicator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

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
  }
  return kNoRank;
}

absl::Status Communicator::SetMesh(const plan::Mesh& mesh) {
  if (mesh.cp < 1 || mesh.dp < 1 || mesh.cp * mesh.dp != world_size_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the plan was compiled for cp=%d x dp=%d = %d ranks, but %d rank%s started", mesh.cp,
        mesh.dp, mesh.cp * mesh.dp, world_size_, world_size_ == 1 ? " was" : "s were"));
  }
  HCP_RETURN_IF_ERROR(DoSetMesh(mesh));
  mesh_ = mesh;
  return absl::OkStatus();
}

void Communicator::AllReduceSum(float* data, int64_t n, Group group) {
  if (n < 0) Misuse(absl::StrFormat("all-reduce of %d values", n));
  size(group);  // checks the mesh for kCp and kDp
  DoAllReduceSum(data, n, group);
}

void Communicator::AllReduceSum(double* data, int64_t n, Group group) {
  if (n < 0) Misuse(absl::StrFormat("all-reduce of %d values", n));
  size(group);
  DoAllReduceSum(data, n, group);
}

void Communicator::AllGather(std::span<const std::byte> send, std::span<std::byte> recv,
                             Group group) {
  const size_t want = send.size() * static_cast<size_t>(size(group));
  if (recv.size() != want) {
    Misuse(absl::StrFormat("all-gather of %d bytes over %d ranks into %d bytes", send.size(),
                           size(group), recv.size()));
  }
  DoAllGather(send, recv, group);
}

void Communicator::SendRecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv,
                            int source, Group group) {
  const int world_dest = WorldRank(group, dest);
  const int world_source = WorldRank(group, source);
  DoSendRecv(dest == kNoRank ? std::span<const std::byte>() : send, world_dest,
             source == kNoRank ? std::span<std::byte>() : recv, world_source);
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

}  // namespace hcp::comm
