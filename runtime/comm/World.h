// The ranks this process runs with: MPI's world when started by mpirun/srun (and built with
// MPI), one rank otherwise.
#pragma once

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/comm/Communicator.h"

namespace hcp {

class World {
 public:
  // Joins MPI when a launcher started this process (its environment says so), else one rank.
  // Refuses a launch whose processes each see a world of their own (CheckLaunch in Launch.h:
  // srun without PMI, another MPI's mpirun). Every collective of the communicator then waits at
  // most `timeout` for the other ranks (Communicator.h, "Failure").
  static absl::StatusOr<World> Join(std::chrono::seconds timeout = comm::kDefaultTimeout);

  comm::Communicator& comm() { return *comm_; }
  bool is_root() const { return comm_->world_rank() == 0; }

 private:
  std::shared_ptr<void> session_;  // keeps MPI initialised while the communicator lives
  std::unique_ptr<comm::Communicator> comm_;
};

}  // namespace hcp
