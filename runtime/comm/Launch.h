// Launching mistakes that would otherwise run silently wrong: checked at startup, before any
// work. Each decision is a pure function of what the ranks report, so that it can be tested
// without a launcher or a GPU.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/comm/Communicator.h"

namespace hcp::comm {

// How many processes the launcher says it started, from the environment.
struct LaunchEnv {
  // srun's SLURM_STEP_NUM_TASKS: set by srun for the tasks of a job step, not in a batch script
  // (whose SLURM_NTASKS is the allocation's, and which may well run one rank by itself).
  std::optional<int> srun_tasks;
  std::optional<int> mpirun_size;  // Open MPI's OMPI_COMM_WORLD_SIZE
  std::optional<int> pmi_size;     // PMI_SIZE: MPICH's mpiexec (hydra), srun --mpi=pmi2
  static LaunchEnv FromEnvironment();
};

// InvalidArgument when the launcher started several processes but MPI sees fewer ranks in each
// (`world_size`): every process would run the whole job alone. Names the launcher and the fix:
//   "srun started 4 tasks but MPI sees 1 rank in each: srun was run without PMI; use srun
//    --mpi=pmix (or --mpi=pmi2), or mpirun"
absl::Status CheckLaunch(const LaunchEnv& env, int world_size);

// One rank's GPU, as NcclCommunicator::Create reports it.
struct RankGpu {
  std::string node;  // the host name
  std::string gpu;   // the GPU's PCI bus id; empty when the rank has none
  int visible = 0;   // GPUs this rank sees on its node
};

// InvalidArgument when two ranks would share a GPU (the same node and bus id), naming each such
// node, its GPU count and the ranks started on it; `ranks` is indexed by world rank.
absl::Status CheckOneRankPerGpu(const std::vector<RankGpu>& ranks);

// Every rank's RankGpu, in world rank order. Collective over the world.
std::vector<RankGpu> GatherRankGpus(Communicator& comm, const RankGpu& mine);
// This machine's host name.
std::string HostName();

}  // namespace hcp::comm
