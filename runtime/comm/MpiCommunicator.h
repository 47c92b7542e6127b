// The MPI communicator for CPU ranks started by mpirun (only built with HYBRIDCP_ENABLE_MPI,
// which defines HYBRIDCP_HAVE_MPI for everything that links hcp_comm). mpi.h stays inside
// MpiCommunicator.cpp: nothing else in the runtime sees MPI.
//
//   int main(int argc, char** argv) {
//     comm::MpiSession mpi(&argc, &argv);          // MPI_Init here, MPI_Finalize at scope exit
//     auto world = comm::MpiCommunicator::Create();  // the world only, no mesh yet
//     plan::RankPlan mine = plan::LoadPlanForRank(path);
//     if (absl::Status s = comm::CheckRanksAgree(**world, mine.plan, mine.hash); !s.ok()) ...
//     ... CpuExecutor::Create(*mine.plan, **world) ...
//   }
#pragma once

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/comm/Communicator.h"

namespace hcp::comm {

// Owns MPI's lifetime in a process: MPI_Init on construction unless MPI is already initialised
// (then it owns nothing), MPI_Finalize on destruction if it initialised MPI. Keep it alive for as
// long as any MpiCommunicator. MPI_COMM_WORLD keeps MPI_ERRORS_ARE_FATAL: an MPI error aborts
// the job.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  // MPI_Initialized and not yet MPI_Finalized.
  static bool Active();

  // MPI_Finalize waits for every rank, so a rank that stops answering after the job's last
  // collective would hold the others there forever: past this long, the process ends itself,
  // non-zero, with a message (and mpirun ends the rest of the job).
  void set_finalize_timeout(std::chrono::seconds timeout) { finalize_timeout_ = timeout; }

 private:
  bool owns_ = false;
  std::chrono::seconds finalize_timeout_ = kDefaultTimeout;
};

class MpiCommunicator final : public Communicator {
 public:
  // The world of this job (MPI_COMM_WORLD, duplicated so our messages never meet anyone
  // else's). FailedPrecondition if MPI is not initialised (create an MpiSession first).
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create();
  ~MpiCommunicator() override;

  // MPI_Abort on the world after printing "rank N: error: ..." to stderr.
  [[noreturn]] void Abort(const absl::Status& status) override;

 protected:
  // MPI_Comm_split of the world into the cp groups (color dp_index, key cp_index), the dp
  // groups (color cp_index, key dp_index), the ep groups (color world_rank / ep, key
  // world_rank % ep) and the ep replicas (the reverse), so group ranks are as Communicator.h
  // says.
  absl::Status DoSetMesh(const plan::Mesh& mesh) override;
  void DoAllReduceSum(float* data, int64_t n, Group group) override;
  void DoAllReduceSum(double* data, int64_t n, Group group) override;
  void DoAllGather(std::span<const std::byte> send, std::span<std::byte> recv,
                   Group group) override;
  void DoSendRecv(std::span<const std::byte> send, int world_dest, std::span<std::byte> recv,
                  int world_source) override;
  void DoAllToAllV(std::span<const std::byte> send, std::span<const int64_t> send_bytes,
                   std::span<std::byte> recv, std::span<const int64_t> recv_bytes,
                   std::span<const int> world_ranks) override;
  void DoBarrier(Group group) override;

 private:
  struct Comms;  // the MPI_Comm handles, in the .cpp
  MpiCommunicator(int world_rank, int world_size, std::unique_ptr<Comms> comms);

  std::unique_ptr<Comms> comms_;
};

}  // namespace hcp::comm
