// test_comm_stopped_at_exit: a rank that stops answering after the job's last collective. Rank 1
// stops itself (SIGSTOP) after a barrier; rank 0 goes on to the end of the job, where
// MPI_Finalize waits for every rank. With a 3 s timeout, rank 0 must end itself there with a
// message instead of waiting forever, and mpirun then ends rank 1 (ctest: the message, within
// the test's time limit). Run under mpirun -np 2.
#include <chrono>
#include <csignal>
#include <cstdio>

#include "runtime/comm/World.h"
#include "runtime/support/Status.h"

int main() {
  absl::StatusOr<hcp::World> world = hcp::World::Join(std::chrono::seconds(3));
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", hcp::FormatError(world.status()).c_str());
    return 2;
  }
  world->comm().Barrier(hcp::comm::Group::kWorld);
  if (world->comm().world_rank() == 1) std::raise(SIGSTOP);
  return 0;
}
