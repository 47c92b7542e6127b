// Collectives on GPU buffers, through NCCL, one GPU per rank. The host Communicator (MPI, or one
// local rank) bootstraps it: rank 0 of the world makes NCCL's unique id and shares it with an
// all-gather, then the world communicator is split into the mesh's cp and dp groups and, with
// ep > 1, its ep and ep-replica groups, so a group rank means the same here as in
// Communicator.h (kCp: cp_index, kDp: dp_index, kEp: ep_index, kEpReplica: world_rank / ep).
//
// Failure: every call is enqueued on a stream and returns at once. Wait() is where a rank
// notices trouble: it polls the stream and NCCL's asynchronous error, and if NCCL failed or
// the work did not finish within the timeout (a peer died or hangs), it ends the whole job
// through the host communicator (mpirun then ends every rank), with a message naming the rank
// and what it was waiting for, so no rank is left hanging (scripts/gpu/run_cp_tests.sh checks
// both a rank that hangs and one that exits, with tests/cuda/test_nccl_failure).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/comm/Communicator.h"

namespace hcp::comm {

class NcclCommunicator {
 public:
  // Collective over the host world, whose mesh must be set. `device` is this rank's GPU.
  // Refuses (the same error on every rank) ranks that would share a GPU: more ranks on a node
  // than it has GPUs (CheckOneRankPerGpu, Launch.h).
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(Communicator& host, int device,
                                                                  std::chrono::seconds timeout);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  Communicator& host() const { return host_; }

  // The GPU a rank of a multi-GPU job uses: its rank among the ranks on its machine (mpirun's
  // OMPI_COMM_WORLD_LOCAL_RANK, srun's SLURM_LOCALID, MPICH's MPI_LOCALRANKID; else the world
  // rank), modulo the visible devices.
  static int LocalDevice(const Communicator& host);

  // recv[i] = sum over the group of send[i] (send == recv: in place), summed in `type`.
  void AllReduceSum(const void* send, void* recv, size_t count, ncclDataType_t type, Group group,
                    cudaStream_t stream);
  // recv = group rank r's `recv_count` elements of the sum over the group of send, whose
  // elements [r * recv_count, (r + 1) * recv_count) they are (recv == send + r * recv_count: in
  // place), summed in `type`.
  void ReduceScatterSum(const void* send, void* recv, size_t recv_count, ncclDataType_t type,
                        Group group, cudaStream_t stream);
  // Brackets a batch of calls that NCCL launches as one (ncclGroupStart / ncclGroupEnd).
  void GroupStart();
  void GroupEnd();
  // recv = every group rank's `count` elements of send, in group rank order (send == recv +
  // r * count on group rank r: in place).
  void AllGather(const void* send, void* recv, size_t count, ncclDataType_t type, Group group,
                 cudaStream_t stream);
  // All-to-all with per-peer counts (elements of `type`): send_counts[p] elements go to group
  // rank p, taken from `send` in group rank order, and recv_counts[p] arrive from it into `recv`
  // likewise. recv_counts[p] must be what p sends here (exchange the counts first).
  void AllToAllV(const void* send, std::span<const int64_t> send_counts, void* recv,
                 std::span<const int64_t> recv_counts, ncclDataType_t type, Group group,
                 cudaStream_t stream);
  // Sends to group rank `dest` and receives from `source` at once (either may be kNoRank).
  void SendRecv(const void* send, size_t send_count, int dest, void* recv, size_t recv_count,
                int source, ncclDataType_t type, Group group, cudaStream_t stream);

  // Waits for `stream` to drain; on an NCCL error or after the timeout, aborts the job with a
  // message that says what was being waited for; the host communicator's Abort puts the rank in
  // front ("rank 0: error: running the plan's steps did not finish within 300 s: another rank
  // failed or hangs").
  void Wait(cudaStream_t stream, const std::string& what);
  // The same for one event (the work queued before it was recorded).
  void Wait(cudaEvent_t event, const std::string& what);

 private:
  NcclCommunicator(Communicator& host, std::chrono::seconds timeout)
      : host_(host), timeout_(timeout) {}
  ncclComm_t CommOf(Group group) const;
  [[noreturn]] void Fail(const std::string& message) const;
  // Polls `query` (cudaSuccess: done) and NCCL's asynchronous errors until done or the timeout.
  void WaitUntil(const std::function<cudaError_t()>& query, const std::string& what);

  Communicator& host_;
  std::chrono::seconds timeout_;
  ncclComm_t world_ = nullptr;
  ncclComm_t cp_ = nullptr;
  ncclComm_t dp_ = nullptr;
  ncclComm_t ep_ = nullptr;          // ep > 1 only
  ncclComm_t ep_replica_ = nullptr;  // ep > 1 only; with ep = 1 the replicas are the world
};

}  // namespace hcp::comm
