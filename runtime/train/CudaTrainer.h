// The training loop of Trainer.h on GPUs: a bf16 plan, one process per GPU (cp x dp ranks under
// mpirun, NCCL between them; one GPU without it), the CUDA executor's device AdamW (fp32 master
// weights and moments on every GPU, or with --shard-optimizer each GPU's slice of them:
// CudaExecutor::Options::shard_optimizer). Same data order, loss normalisation, schedule, NaN/Inf
// policy, clipping, metrics and checkpoints (the same files: a GPU run resumes from its own
// checkpoints, and its checkpoints hold fp32 masters a CPU run can load too).
//
// Gradient accumulation keeps the running sum of the micro-batches' gradients on the device in
// fp32, rounded to each gradient's dtype once at the end (CudaExecutor::StashGradients).
#pragma once

#include "absl/status/status.h"
#include "runtime/comm/Communicator.h"
#include "runtime/plan/Plan.h"
#include "runtime/train/Trainer.h"

namespace hcp::train {

// Trains `plan` (a bf16 plan, see CudaBackend.h) on `comm`, whose mesh must already be the
// plan's (comm::CheckRanksAgree). Collective: every rank returns the same status; progress on
// rank 0's stdout.
absl::Status TrainOnGpus(comm::Communicator& comm, const plan::Plan& plan,
                         const TrainOptions& options);

}  // namespace hcp::train
