#include "runtime/comm/World.h"

#include <cstdlib>

#include "runtime/comm/Launch.h"
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

absl::StatusOr<World> World::Join(std::chrono::seconds timeout) {
  World world;
  if (StartedByLauncher()) {
#ifdef HYBRIDCP_HAVE_MPI
    auto session = std::make_shared<comm::MpiSession>(nullptr, nullptr);
    session->set_finalize_timeout(timeout);
    world.session_ = session;
    absl::StatusOr<std::unique_ptr<comm::MpiCommunicator>> mpi = comm::MpiCommunicator::Create();
    if (!mpi.ok()) return mpi.status();
    world.comm_ = std::move(*mpi);
#else
    return absl::FailedPreconditionError(
        "started by an MPI launcher, but this hybridcp was built without MPI "
        "(configure with -DHYBRIDCP_ENABLE_MPI=ON)");
#endif
  } else {
    world.comm_ = std::make_unique<comm::LocalCommunicator>();
  }
  // Each process decides alone, from its own environment and world: no collective is involved
  // (a process that sees a world of its own could not reach the others anyway).
  if (absl::Status launch =
          comm::CheckLaunch(comm::LaunchEnv::FromEnvironment(), world.comm_->world_size());
      !launch.ok()) {
    return launch;
  }
  world.comm_->set_timeout(timeout);
  return world;
}

}  // namespace hcp
