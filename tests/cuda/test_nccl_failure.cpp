// test_nccl_failure: what the other ranks do when one rank of a multi-GPU job stops taking part.
// Started by mpirun with 2 or more ranks, one GPU each:
//   mpirun -np 2 test_nccl_failure hang   rank 1 skips a collective (as a rank stuck in a bug
//                                         would); rank 0 must give up after the timeout with a
//                                         message naming itself and what it waited for, and
//                                         the whole job must end (no rank left running).
//   mpirun -np 2 test_nccl_failure exit   rank 1 exits in the middle of the job; mpirun must end
//                                         the other ranks.
// Both first check that a collective works (an all-reduce of known values). The job's exit
// status is then NOT zero, by design: scripts/gpu/run_cp_tests.sh checks the status, the message
// and that it ended long before rank 1's 120 s sleep. Needs GPUs, so not a ctest test.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/NcclCommunicator.h"
#include "runtime/comm/World.h"
#include "runtime/support/Status.h"

namespace hcp {
namespace {

constexpr auto kTimeout = std::chrono::seconds(10);

int Main(int argc, char** argv) {
  const std::string mode = argc == 2 ? argv[1] : "";
  if (mode != "hang" && mode != "exit") {
    std::fprintf(stderr, "usage: mpirun -np N test_nccl_failure hang|exit\n");
    return 2;
  }
  absl::StatusOr<World> world = World::Join();
  if (!world.ok()) {
    std::fprintf(stderr, "test_nccl_failure: %s\n", FormatError(world.status()).c_str());
    return 2;
  }
  comm::Communicator& ranks = world->comm();
  if (ranks.world_size() < 2) {
    std::fprintf(stderr, "test_nccl_failure: start it with mpirun -np 2 (or more)\n");
    return 2;
  }
  plan::Mesh mesh;
  mesh.cp = ranks.world_size();
  if (absl::Status s = ranks.SetMesh(mesh); !s.ok()) ranks.Abort(s);
  const int device = comm::NcclCommunicator::LocalDevice(ranks);
  absl::StatusOr<std::unique_ptr<comm::NcclCommunicator>> nccl =
      comm::NcclCommunicator::Create(ranks, device, kTimeout);
  if (!nccl.ok()) ranks.Abort(nccl.status());
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  float* data = nullptr;
  cudaMalloc(&data, sizeof(float));

  // A collective that works: every rank adds its rank + 1.
  const float mine = static_cast<float>(ranks.world_rank() + 1);
  cudaMemcpy(data, &mine, sizeof(float), cudaMemcpyHostToDevice);
  (*nccl)->AllReduceSum(data, data, 1, ncclFloat32, comm::Group::kWorld, stream);
  (*nccl)->Wait(stream, "the first all-reduce");
  float sum = 0;
  cudaMemcpy(&sum, data, sizeof(float), cudaMemcpyDeviceToHost);
  const int n = ranks.world_size();
  if (sum != static_cast<float>(n * (n + 1) / 2)) {
    ranks.Abort(absl::InternalError("the first all-reduce gave " + std::to_string(sum)));
  }
  std::printf("rank %d: first all-reduce ok (%g)\n", ranks.world_rank(), sum);
  std::fflush(stdout);

  if (ranks.world_rank() == 1) {
    if (mode == "exit") {
      std::fprintf(stderr, "rank 1: exiting now, in the middle of the job\n");
      std::_Exit(3);
    }
    std::fprintf(stderr, "rank 1: skipping the second all-reduce, sleeping 120 s\n");
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  (*nccl)->AllReduceSum(data, data, 1, ncclFloat32, comm::Group::kWorld, stream);
  std::printf("rank %d: waiting for the second all-reduce (timeout %d s)\n", ranks.world_rank(),
              static_cast<int>(kTimeout.count()));
  std::fflush(stdout);
  (*nccl)->Wait(stream, "the second all-reduce");  // never returns: the job ends in here
  std::printf("rank %d: the second all-reduce finished: the failure went unnoticed\n",
              ranks.world_rank());
  return 0;
}

}  // namespace
}  // namespace hcp

int main(int argc, char** argv) { return hcp::Main(argc, argv); }
