// The communication between the ranks of a tensor-parallel model (runtime/tensor_parallel_backend.h):
// the graph's AllReduce ops call it. Two kinds: NCCL between GPUs (runtime/cuda/nccl_collective.h,
// inside the CUDA graphs), and one in host memory between the threads of one process, for CPU
// ranks (tests of the sharded graphs without a GPU, and their reference on every ISA path).
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

namespace alloy {

class Collective {
public:
    virtual ~Collective() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    // Sums n floats at `data` over the ranks, in place, every rank getting the same bits. Every
    // rank calls it with the same n in the same order. `stream`: the caller's cudaStream_t for
    // a device collective (the sum is queued on it), nullptr on the host (done on return).
    virtual void all_reduce_sum(float* data, size_t n, void* stream) = 0;
    // Around each of this rank's steps: the host collective lets one rank's kernels run at a
    // time (the CPU kernels share one process-wide thread pool, which is not reentrant), and
    // hands that turn over while a rank waits in all_reduce_sum.
    virtual void begin_step() {}
    virtual void end_step() {}
};

// n collectives (ranks 0..n-1) between threads of this process, in host memory. The sum is
// taken in rank order (rank 0 + rank 1 + ...), so every run gives the same bits.
std::vector<std::shared_ptr<Collective>> make_host_collectives(int n);

}  // namespace alloy
