// NCCL between the GPUs of one process, one communicator a rank (runtime/collective.h): the
// tensor-parallel backend's all-reduces, queued on each rank's stream (and so recorded into its
// CUDA graphs). libnccl.so.2 is loaded when first asked for (dlopen), so a binary that never
// runs on several GPUs needs no NCCL at all; NVLink multicast (NVLS) is kept off unless
// NCCL_NVLS_ENABLE is set (it can take the host's GPUs down on the shared machines).
#pragma once
#include <memory>
#include <vector>

#include "runtime/collective.h"

namespace alloy {

// Communicators for GPUs 0..n-1 (ncclCommInitAll); throws alloy::Error naming what failed
// (libnccl.so.2 not found: set LD_LIBRARY_PATH; fewer GPUs than n).
std::vector<std::shared_ptr<Collective>> make_nccl_collectives(int n);

// n ranks whose device arrays are summed through host memory (the stream synchronized, copied
// out, summed in rank order by make_host_collectives, copied back): several ranks on ONE GPU,
// to test the sharded graphs' CUDA kernels where no second GPU is lent (tensor parallel child
// "cuda-staged"). Slow, and not capturable: a plan recording it runs launch by launch.
std::vector<std::shared_ptr<Collective>> make_host_staged_collectives(int n);

}  // namespace alloy
