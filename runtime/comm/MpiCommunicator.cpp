#include "runtime/comm/MpiCommunicator.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/comm/Deadline.h"
#include "runtime/support/Status.h"

namespace hcp::comm {
namespace {

// Messages go in pieces of at most this many bytes (MPI counts are ints).
constexpr int64_t kMaxChunkBytes = int64_t{1} << 30;
// All our point-to-point messages use one tag on our own communicator: matching is by source
// and order (MPI never lets two messages between the same pair overtake each other).
constexpr int kTag = 0;
// All-to-alls use their own tag, so their messages never match a SendRecv's.
constexpr int kAllToAllTag = 1;

// A message of `bytes` travels as this many pieces: at least one, so an empty message is still
// one (empty) MPI message that its receive matches.
int64_t Pieces(size_t bytes) {
  return std::max<int64_t>(1, (static_cast<int64_t>(bytes) + kMaxChunkBytes - 1) / kMaxChunkBytes);
}
int PieceBytes(size_t bytes, int64_t piece) {
  return static_cast<int>(
      std::min<int64_t>(kMaxChunkBytes, static_cast<int64_t>(bytes) - piece * kMaxChunkBytes));
}

bool Initialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// Waits for a non-blocking collective on `group`, or for point-to-point requests (request i
// with world rank peers[i], statuses[i] its status), for at most comm.timeout(); past it, ends
// the job with a message naming the collective (`kind`) and the peers that did not answer.
void AwaitCollective(Communicator& comm, MPI_Request& request, std::string_view kind, Group group) {
  const bool done = PollUntil(
      [&] {
        int flag = 0;
        MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
        return flag != 0;
      },
      comm.timeout());
  if (done) return;
  // Who has not joined cannot be known from here: the group's other ranks are named.
  StalledWait wait;
  wait.kind = kind;
  wait.group = GroupName(group);
  for (int r = 0; r < comm.size(group); ++r) wait.members.push_back(comm.WorldRank(group, r));
  wait.self = comm.world_rank();
  wait.during = comm.traffic_label();
  wait.timeout = comm.timeout();
  comm.Abort(absl::DeadlineExceededError(DescribeStalledWait(wait)));
}

void AwaitMessages(Communicator& comm, std::vector<MPI_Request>& requests,
                   const std::vector<int>& peers, std::vector<MPI_Status>& statuses,
                   std::string_view kind) {
  const int n = static_cast<int>(requests.size());
  const bool done = PollUntil(
      [&] {
        int flag = 0;
        MPI_Testall(n, requests.data(), &flag, statuses.data());
        return flag != 0;
      },
      comm.timeout());
  if (done) return;
  // An unfinished MPI_Testall leaves every request as it was: the open ones name the peers.
  StalledWait wait;
  wait.kind = kind;
  wait.self = comm.world_rank();
  wait.during = comm.traffic_label();
  wait.timeout = comm.timeout();
  for (int i = 0; i < n; ++i) {
    wait.members.push_back(peers[i]);
    int flag = 0;
    MPI_Test(&requests[i], &flag, MPI_STATUS_IGNORE);
    if (!flag) wait.silent.push_back(peers[i]);
  }
  comm.Abort(absl::DeadlineExceededError(DescribeStalledWait(wait)));
}

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  MPI_Init(argc, argv);
  owns_ = true;
}

MpiSession::~MpiSession() {
  if (!owns_ || !Initialized()) return;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::thread([rank, timeout = finalize_timeout_] {
    std::this_thread::sleep_for(timeout);
    std::fprintf(stderr,
                 "rank %d: error: the end of the job (MPI_Finalize) did not finish within %d s: "
                 "another rank did not answer (stopped, hung or dead); ending this rank\n",
                 rank, static_cast<int>(timeout.count()));
    std::fflush(stderr);
    std::_Exit(1);
  }).detach();
  MPI_Finalize();
}

bool MpiSession::Active() { return Initialized(); }

struct MpiCommunicator::Comms {
  MPI_Comm world = MPI_COMM_NULL;
  MPI_Comm cp = MPI_COMM_NULL;
  MPI_Comm dp = MPI_COMM_NULL;
  MPI_Comm ep = MPI_COMM_NULL;
  MPI_Comm ep_replica = MPI_COMM_NULL;

  MPI_Comm Of(Group group) const {
    switch (group) {
      case Group::kWorld:
        return world;
      case Group::kCp:
        return cp;
      case Group::kDp:
        return dp;
      case Group::kEp:
        return ep;
      case Group::kEpReplica:
        return ep_replica;
    }
    return MPI_COMM_NULL;
  }
  void FreeGroups() {
    Free(cp);
    Free(dp);
    Free(ep);
    Free(ep_replica);
  }
  static void Free(MPI_Comm& comm) {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    comm = MPI_COMM_NULL;
  }
};

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create() {
  if (!Initialized()) {
    return absl::FailedPreconditionError(
        "MPI is not initialised: create an MpiSession before an MpiCommunicator");
  }
  auto comms = std::make_unique<Comms>();
  // Collective over the world: every rank creates its communicator at the same point.
  MPI_Comm_dup(MPI_COMM_WORLD, &comms->world);
  MPI_Comm_set_errhandler(comms->world, MPI_ERRORS_ARE_FATAL);
  int rank = 0, size = 0;
  MPI_Comm_rank(comms->world, &rank);
  MPI_Comm_size(comms->world, &size);
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(rank, size, std::move(comms)));
}

MpiCommunicator::MpiCommunicator(int world_rank, int world_size, std::unique_ptr<Comms> comms)
    : Communicator(world_rank, world_size), comms_(std::move(comms)) {}

MpiCommunicator::~MpiCommunicator() {
  if (!Initialized()) return;  // MPI_Finalize has released everything
  comms_->FreeGroups();
  Comms::Free(comms_->world);
}

void MpiCommunicator::Abort(const absl::Status& status) {
  std::fprintf(stderr, "rank %d: %s\n", world_rank(), FormatError(status).c_str());
  std::fflush(stderr);
  MPI_Abort(comms_->world != MPI_COMM_NULL ? comms_->world : MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

absl::Status MpiCommunicator::DoSetMesh(const plan::Mesh& mesh) {
  comms_->FreeGroups();
  const int cp = static_cast<int>(mesh.cp), ep = static_cast<int>(mesh.ep);
  const int cp_index = world_rank() % cp, dp_index = world_rank() / cp;
  MPI_Comm_split(comms_->world, /*color=*/dp_index, /*key=*/cp_index, &comms_->cp);
  MPI_Comm_split(comms_->world, /*color=*/cp_index, /*key=*/dp_index, &comms_->dp);
  const int ep_group = world_rank() / ep, ep_index = world_rank() % ep;
  MPI_Comm_split(comms_->world, /*color=*/ep_group, /*key=*/ep_index, &comms_->ep);
  MPI_Comm_split(comms_->world, /*color=*/ep_index, /*key=*/ep_group, &comms_->ep_replica);
  return absl::OkStatus();
}

void MpiCommunicator::DoAllReduceSum(float* data, int64_t n, Group group) {
  constexpr int64_t kChunk = kMaxChunkBytes / sizeof(float);
  for (int64_t i = 0; i < n; i += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, n - i));
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, data + i, count, MPI_FLOAT, MPI_SUM, comms_->Of(group), &request);
    AwaitCollective(*this, request, "all-reduce", group);
  }
}

void MpiCommunicator::DoAllReduceSum(double* data, int64_t n, Group group) {
  constexpr int64_t kChunk = kMaxChunkBytes / sizeof(double);
  for (int64_t i = 0; i < n; i += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, n - i));
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, data + i, count, MPI_DOUBLE, MPI_SUM, comms_->Of(group), &request);
    AwaitCollective(*this, request, "all-reduce", group);
  }
}

void MpiCommunicator::DoAllGather(std::span<const std::byte> send, std::span<std::byte> recv,
                                  Group group) {
  // The same size on every rank, so every rank takes the same branch.
  if (send.size() > static_cast<size_t>(INT_MAX)) {
    Misuse(absl::StrFormat("all-gather of %d bytes per rank (at most %d)", send.size(), INT_MAX));
  }
  const int count = static_cast<int>(send.size());
  MPI_Request request;
  MPI_Iallgather(send.data(), count, MPI_BYTE, recv.data(), count, MPI_BYTE, comms_->Of(group),
                 &request);
  AwaitCollective(*this, request, "all-gather", group);
}

void MpiCommunicator::DoSendRecv(std::span<const std::byte> send, int world_dest,
                                 std::span<std::byte> recv, int world_source) {
  // Every piece of both messages is posted before waiting for any of them: no deadlock whatever
  // the peers do first.
  std::vector<MPI_Request> requests;
  std::vector<int> peers;       // the world rank of each request
  std::vector<int> recv_sizes;  // expected bytes of each receive request, in order
  if (world_source != kNoRank) {
    for (int64_t piece = 0; piece < Pieces(recv.size()); ++piece) {
      const int count = PieceBytes(recv.size(), piece);
      requests.emplace_back();
      MPI_Irecv(recv.data() + piece * kMaxChunkBytes, count, MPI_BYTE, world_source, kTag,
                comms_->world, &requests.back());
      peers.push_back(world_source);
      recv_sizes.push_back(count);
    }
  }
  if (world_dest != kNoRank) {
    for (int64_t piece = 0; piece < Pieces(send.size()); ++piece) {
      requests.emplace_back();
      MPI_Isend(send.data() + piece * kMaxChunkBytes, PieceBytes(send.size(), piece), MPI_BYTE,
                world_dest, kTag, comms_->world, &requests.back());
      peers.push_back(world_dest);
    }
  }
  std::vector<MPI_Status> statuses(requests.size());
  AwaitMessages(*this, requests, peers, statuses, "send/receive");
  // A longer message than expected is an MPI truncation error (fatal); a shorter one is caught
  // here.
  for (size_t i = 0; i < recv_sizes.size(); ++i) {
    int count = 0;
    MPI_Get_count(&statuses[i], MPI_BYTE, &count);
    if (count != recv_sizes[i]) {
      Misuse(absl::StrFormat("received %d bytes from rank %d, expected %d", count, world_source,
                             recv_sizes[i]));
    }
  }
}

void MpiCommunicator::DoAllToAllV(std::span<const std::byte> send,
                                  std::span<const int64_t> send_bytes, std::span<std::byte> recv,
                                  std::span<const int64_t> recv_bytes,
                                  std::span<const int> world_ranks) {
  // Point to point on the world communicator, every piece posted before waiting for any (as
  // SendRecv), so messages of any size go through; empty messages are not sent at all (both
  // sides know the sizes). This rank's own part is a copy.
  std::vector<MPI_Request> requests;
  std::vector<int> peers;                     // the world rank of each request
  std::vector<std::pair<int, int>> expected;  // (bytes, source) of each receive request
  size_t send_at = 0, recv_at = 0;
  std::vector<size_t> send_offsets(world_ranks.size()), recv_offsets(world_ranks.size());
  for (size_t p = 0; p < world_ranks.size(); ++p) {
    send_offsets[p] = send_at;
    recv_offsets[p] = recv_at;
    send_at += static_cast<size_t>(send_bytes[p]);
    recv_at += static_cast<size_t>(recv_bytes[p]);
  }
  for (size_t p = 0; p < world_ranks.size(); ++p) {
    const size_t bytes = static_cast<size_t>(recv_bytes[p]);
    if (world_ranks[p] == world_rank() || bytes == 0) continue;
    for (int64_t piece = 0; piece < Pieces(bytes); ++piece) {
      const int count = PieceBytes(bytes, piece);
      requests.emplace_back();
      MPI_Irecv(recv.data() + recv_offsets[p] + piece * kMaxChunkBytes, count, MPI_BYTE,
                world_ranks[p], kAllToAllTag, comms_->world, &requests.back());
      peers.push_back(world_ranks[p]);
      expected.emplace_back(count, world_ranks[p]);
    }
  }
  const size_t receives = requests.size();
  for (size_t p = 0; p < world_ranks.size(); ++p) {
    const size_t bytes = static_cast<size_t>(send_bytes[p]);
    if (bytes == 0) continue;
    if (world_ranks[p] == world_rank()) {
      if (recv_bytes[p] != send_bytes[p]) {
        Misuse(absl::StrFormat("all-to-all: this rank sends itself %d bytes but expects %d",
                               send_bytes[p], recv_bytes[p]));
      }
      std::memcpy(recv.data() + recv_offsets[p], send.data() + send_offsets[p], bytes);
      continue;
    }
    for (int64_t piece = 0; piece < Pieces(bytes); ++piece) {
      requests.emplace_back();
      MPI_Isend(send.data() + send_offsets[p] + piece * kMaxChunkBytes, PieceBytes(bytes, piece),
                MPI_BYTE, world_ranks[p], kAllToAllTag, comms_->world, &requests.back());
      peers.push_back(world_ranks[p]);
    }
  }
  std::vector<MPI_Status> statuses(requests.size());
  AwaitMessages(*this, requests, peers, statuses, "all-to-all");
  for (size_t i = 0; i < receives; ++i) {
    int count = 0;
    MPI_Get_count(&statuses[i], MPI_BYTE, &count);
    if (count != expected[i].first) {
      Misuse(absl::StrFormat("all-to-all: received %d bytes from rank %d, expected %d", count,
                             expected[i].second, expected[i].first));
    }
  }
}

void MpiCommunicator::DoBarrier(Group group) {
  MPI_Request request;
  MPI_Ibarrier(comms_->Of(group), &request);
  AwaitCollective(*this, request, "barrier", group);
}

}  // namespace hcp::comm
