#include "runtime/comm/World.h"

#include <cstdlib>

#ifdef HYBRIDCP_HAVE_MPI
#include "runtime/comm/MpiCommunicator.h"
#endif

namespace hcp {
namespace {

// Open MPI's mpirun, and PMI/PMIx launchers (srun, MPICH's mpiexec), set one of these.
bool StartedByLauncher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<World> World::Join() {
  World world;
  if (StartedByLauncher()) {
#ifdef HYBRIDCP_HAVE_MPI
    world.session_ = std::make_shared<comm::MpiSession>(nullptr, nullptr);
    absl::StatusOr<std::unique_ptr<comm::MpiCommunicator>> mpi = comm::MpiCommunicator::Create();
    if (!mpi.ok()) return mpi.status();
    world.comm_ = std::move(*mpi);
    return world;
#else
    return absl::FailedPreconditionError(
        "started by an MPI launcher, but this hybridcp was built without MPI "
        "(configure with -DHYBRIDCP_ENABLE_MPI=ON)");
#endif
  }
  world.comm_ = std::make_unique<comm::LocalCommunicator>();
  return world;
}

}  // namespace hcp
