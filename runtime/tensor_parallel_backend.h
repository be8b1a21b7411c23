// Tensor parallelism (issue 22): one model over N ranks (GPUs, or CPU threads for tests), as a
// Backend, so the runner, the engine, speculation and the server run on it unchanged.
//
// Each rank holds its shard of the model (Qwen35Model::shard: heads and hidden units split,
// AllReduce after each block's output projection), a backend of its own (the GPU of its rank,
// or the CPU) with its collective (NCCL, or host memory), and a thread that makes every call
// into that backend (a CUDA device is current per thread; NCCL's ranks must run concurrently).
// compile() builds each rank's graph for the same step kind and compiles it on its rank; a
// replay runs the ranks' plans at once, the logits (and the picked tokens) coming from rank 0,
// whose graph alone keeps the final norm and the LM head (the others stop after the last
// all-reduce). The state is each rank's own (its heads' GDN states and KV rows), behind one
// DeviceState; the slot cache's operations run on every rank.
//
// A verification's GDN replay log is kept per rank (each rank's heads), so a speculative
// rollback replays on every rank as on one backend. Not here: the CPU repacked layouts (shards
// slice GGUF rows).
#pragma once
#include <memory>
#include <string>

#include "runtime/backend.h"

namespace alloy {

// `child`: each rank's backend, "cuda" (GPUs 0..n_ranks-1, NCCL) or "cpu" (host collective;
// ranks take turns on the CPU kernels' thread pool: a test of the sharded graphs, not a speed-up),
// or "cuda-staged" (every rank on GPU 0, sums staged through host memory: a test of the sharded
// graphs' CUDA kernels on one GPU; plans run launch by launch).
// The model must outlive the backend. Throws naming what does not split (Qwen35Model::shard)
// or what is missing (GPUs, NCCL).
// experts_by_id: a qwen35moe model's routed experts placed whole, E / n_ranks a rank (expert
// parallelism, --ep), instead of every expert split by width (Qwen35Model::shard).
std::unique_ptr<Backend> make_tensor_parallel_backend(const Qwen35Model& model, const std::string& child, int n_ranks,
                                                      bool experts_by_id = false);

}  // namespace alloy
