// The CUDA backend (issue 18): a step's graph runs on one NVIDIA GPU through kernels/cuda, the
// ops of kernels/ref under the same names. Weights are uploaded on first compile (keyed by
// their host address), the slot state (GDN conv and recurrent states, K/V per slot) lives in
// device memory (ModelState::device), every intermediate in one device scratch buffer laid out
// as the CPU's (runtime/graph_storage.h). A replay copies the step's ids, positions, offsets,
// slots and logits rows to the device in one transfer, launches the nodes on the backend's
// stream, and copies the logits rows back.
//
// Plans of up to 16 tokens are recorded as CUDA graphs; greedy tokens and top-k pairs are
// picked on the device; qwen35moe runs (kernels/cuda/moe.cu). A rank of a tensor-parallel model
// (runtime/tensor_parallel_backend.h) is this backend on its GPU with an NCCL collective.
// Built only when nvcc is found (CMake: ALLOY_CUDA); make_backend("cuda") throws otherwise.
#pragma once
#include <memory>

#include "runtime/backend.h"
#include "runtime/collective.h"

namespace alloy {

// Throws alloy::Error when no CUDA device is usable.
std::unique_ptr<Backend> make_cuda_backend();
// On GPU `device`, made current for the calling thread (which must be the one that uses the
// backend: the tensor-parallel backend's rank threads); `collective`: the rank's NCCL
// communicator for its graphs' AllReduce ops (runtime/cuda/nccl_collective.h).
std::unique_ptr<Backend> make_cuda_backend(int device, std::shared_ptr<Collective> collective);

}  // namespace alloy
