#include "runtime/comm/NcclCommunicator.h"

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/comm/Agreement.h"
#include "runtime/comm/Launch.h"
#include "runtime/support/Status.h"

namespace hcp::comm {
namespace {

absl::Status NcclStatus(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrFormat("NCCL %s failed: %s", what, ncclGetErrorString(result)));
}

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrFormat("CUDA %s failed: %s", what, cudaGetErrorString(error)));
}

size_t ElementBytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 4;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    Communicator& host, int device, std::chrono::seconds timeout) {
  std::unique_ptr<NcclCommunicator> nccl(new NcclCommunicator(host, timeout));
  absl::Status local = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
  // More ranks on a node than GPUs would share them silently (slow, or out of memory later):
  // refused, by the same decision on every rank from the same gathered facts.
  RankGpu mine;
  mine.node = HostName();
  if (local.ok()) {
    char bus_id[64] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) == cudaSuccess) mine.gpu = bus_id;
    if (cudaGetDeviceCount(&mine.visible) != cudaSuccess) mine.visible = 0;
  }
  HCP_RETURN_IF_ERROR(CheckOneRankPerGpu(GatherRankGpus(host, mine)));
  // Rank 0 makes the id; everyone takes rank 0's copy out of an all-gather.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (local.ok() && host.world_rank() == 0)
    local = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::vector<ncclUniqueId> ids(host.world_size());
  host.AllGather(std::as_bytes(std::span(&id, 1)), std::as_writable_bytes(std::span(ids)),
                 Group::kWorld);
  // A rank without its GPU (or rank 0 without an id) stops everyone before NCCL's own collective
  // initialisation, which would otherwise wait for it forever.
  HCP_RETURN_IF_ERROR(AgreeOnStatus(host, local));
  if (local.ok()) {
    local =
        NcclStatus(ncclCommInitRank(&nccl->world_, host.world_size(), ids[0], host.world_rank()),
                   "ncclCommInitRank");
  }
  // The cp group: same dp_index, ordered by cp_index; the dp group: same cp_index.
  if (local.ok()) {
    local = NcclStatus(
        ncclCommSplit(nccl->world_, host.dp_index(), host.cp_index(), &nccl->cp_, nullptr),
        "ncclCommSplit (cp)");
  }
  if (local.ok()) {
    local = NcclStatus(
        ncclCommSplit(nccl->world_, host.cp_index(), host.dp_index(), &nccl->dp_, nullptr),
        "ncclCommSplit (dp)");
  }
  // The ep group: ep consecutive world ranks, ordered by expert index; the ep replicas: the
  // ranks with this rank's expert index, one per ep group.
  const int ep = static_cast<int>(host.mesh().ep);
  if (local.ok() && ep > 1) {
    local = NcclStatus(
        ncclCommSplit(nccl->world_, host.world_rank() / ep, host.ep_index(), &nccl->ep_, nullptr),
        "ncclCommSplit (ep)");
  }
  if (local.ok() && ep > 1) {
    local = NcclStatus(ncclCommSplit(nccl->world_, host.ep_index(), host.world_rank() / ep,
                                     &nccl->ep_replica_, nullptr),
                       "ncclCommSplit (ep replicas)");
  }
  if (!local.ok()) return local;
  return nccl;
}

int NcclCommunicator::LocalDevice(const Communicator& host) {
  int local = host.world_rank();
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    if (const char* value = std::getenv(name); value != nullptr) {
      local = std::atoi(value);
      break;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices <= 0) return 0;
  return local % devices;
}

NcclCommunicator::~NcclCommunicator() {
  for (ncclComm_t comm : {ep_replica_, ep_, cp_, dp_, world_}) {
    if (comm != nullptr) ncclCommDestroy(comm);
  }
}

ncclComm_t NcclCommunicator::CommOf(Group group) const {
  switch (group) {
    case Group::kCp:
      return cp_;
    case Group::kDp:
      return dp_;
    case Group::kEp:
      if (ep_ == nullptr) break;  // ep = 1: nothing to exchange experts with
      return ep_;
    case Group::kEpReplica:
      return ep_replica_ != nullptr ? ep_replica_ : world_;
    case Group::kWorld:
      return world_;
  }
  Fail(absl::StrFormat("NCCL communicator misuse: no %s group with ep = %d", GroupName(group),
                       host_.mesh().ep));
}

void NcclCommunicator::Fail(const std::string& message) const {
  // No ncclCommAbort first: it waits for the kernels in flight, and one that waits for a peer
  // that never comes keeps it waiting (seen on the H200s: a rank that skipped an all-reduce left
  // its peer hanging in the abort, message unprinted). Ending the job (the host communicator's
  // Abort: MPI_Abort, after which mpirun ends every rank) releases the GPUs and NCCL's resources
  // anyway. Should that itself not return, a watchdog ends this process, and mpirun the rest.
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(30));
    std::_Exit(70);
  }).detach();
  host_.Abort(absl::InternalError(message));
  std::abort();  // Abort does not return; this tells the compiler so through the virtual call
}

void NcclCommunicator::AllReduceSum(const void* send, void* recv, size_t count, ncclDataType_t type,
                                    Group group, cudaStream_t stream) {
  ncclResult_t r = ncclAllReduce(send, recv, count, type, ncclSum, CommOf(group), stream);
  if (r != ncclSuccess) Fail(absl::StrFormat("ncclAllReduce: %s", ncclGetErrorString(r)));
}

void NcclCommunicator::ReduceScatterSum(const void* send, void* recv, size_t recv_count,
                                        ncclDataType_t type, Group group, cudaStream_t stream) {
  ncclResult_t r = ncclReduceScatter(send, recv, recv_count, type, ncclSum, CommOf(group), stream);
  if (r != ncclSuccess) Fail(absl::StrFormat("ncclReduceScatter: %s", ncclGetErrorString(r)));
}

void NcclCommunicator::GroupStart() {
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) {
    Fail(absl::StrFormat("ncclGroupStart: %s", ncclGetErrorString(r)));
  }
}

void NcclCommunicator::GroupEnd() {
  if (ncclResult_t r = ncclGroupEnd(); r != ncclSuccess) {
    Fail(absl::StrFormat("ncclGroupEnd: %s", ncclGetErrorString(r)));
  }
}

void NcclCommunicator::AllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                                 Group group, cudaStream_t stream) {
  ncclResult_t r = ncclAllGather(send, recv, count, type, CommOf(group), stream);
  if (r != ncclSuccess) Fail(absl::StrFormat("ncclAllGather: %s", ncclGetErrorString(r)));
}

void NcclCommunicator::AllToAllV(const void* send, std::span<const int64_t> send_counts, void* recv,
                                 std::span<const int64_t> recv_counts, ncclDataType_t type,
                                 Group group, cudaStream_t stream) {
  ncclComm_t comm = CommOf(group);
  const size_t element = ElementBytes(type);
  const auto* from = static_cast<const std::byte*>(send);
  auto* to = static_cast<std::byte*>(recv);
  // One group, so that every pair's send and receive proceed together (no ordering deadlock).
  ncclResult_t r = ncclGroupStart();
  for (size_t p = 0; p < send_counts.size() && r == ncclSuccess; ++p) {
    if (send_counts[p] > 0) {
      r = ncclSend(from, send_counts[p], type, static_cast<int>(p), comm, stream);
      from += send_counts[p] * element;
    }
    if (r == ncclSuccess && recv_counts[p] > 0) {
      r = ncclRecv(to, recv_counts[p], type, static_cast<int>(p), comm, stream);
      to += recv_counts[p] * element;
    }
  }
  ncclResult_t end = ncclGroupEnd();
  if (r == ncclSuccess) r = end;
  if (r != ncclSuccess)
    Fail(absl::StrFormat("all-to-all (ncclSend/ncclRecv): %s", ncclGetErrorString(r)));
}

void NcclCommunicator::SendRecv(const void* send, size_t send_count, int dest, void* recv,
                                size_t recv_count, int source, ncclDataType_t type, Group group,
                                cudaStream_t stream) {
  ncclComm_t comm = CommOf(group);
  // Grouped so that a ring of ranks that all send and receive cannot deadlock.
  ncclResult_t r = ncclGroupStart();
  if (r == ncclSuccess && dest != kNoRank) r = ncclSend(send, send_count, type, dest, comm, stream);
  if (r == ncclSuccess && source != kNoRank)
    r = ncclRecv(recv, recv_count, type, source, comm, stream);
  ncclResult_t end = ncclGroupEnd();
  if (r == ncclSuccess) r = end;
  if (r != ncclSuccess) Fail(absl::StrFormat("ncclSend/ncclRecv: %s", ncclGetErrorString(r)));
}

void NcclCommunicator::Wait(cudaStream_t stream, const std::string& what) {
  WaitUntil([stream] { return cudaStreamQuery(stream); }, what);
}

void NcclCommunicator::Wait(cudaEvent_t event, const std::string& what) {
  WaitUntil([event] { return cudaEventQuery(event); }, what);
}

void NcclCommunicator::WaitUntil(const std::function<cudaError_t()>& query,
                                 const std::string& what) {
  const auto start = std::chrono::steady_clock::now(), deadline = start + timeout_;
  while (true) {
    cudaError_t state = query();
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) {
      Fail(absl::StrFormat("%s: %s", what, cudaGetErrorString(state)));
    }
    for (ncclComm_t comm : {world_, cp_, dp_, ep_, ep_replica_}) {
      ncclResult_t async = ncclSuccess;
      if (comm != nullptr && ncclCommGetAsyncError(comm, &async) == ncclSuccess &&
          async != ncclSuccess && async != ncclInProgress) {
        Fail(absl::StrFormat("%s: NCCL error %s", what, ncclGetErrorString(async)));
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) {
      Fail(absl::StrFormat("%s did not finish within %d s: another rank failed or hangs", what,
                           static_cast<int>(timeout_.count())));
    }
    // Most waits inside a step last microseconds (the MoE steps wait for their routing): poll
    // without sleeping for the first millisecond, since a sleep lasts at least the kernel's
    // timer slack (50 us by default); then sleep between polls.
    if (now - start < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace hcp::comm
