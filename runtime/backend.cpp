#include "runtime/backend.h"

#include "alloy/error.h"
#include "runtime/cpu_backend.h"
#ifdef ALLOY_CUDA
#include "runtime/cuda/cuda_backend.h"
#endif

namespace alloy {

std::unique_ptr<Backend> make_backend(const std::string& name) {
    if (name == "cpu" || name.empty()) return std::make_unique<CpuBackend>();
#ifdef ALLOY_CUDA
    if (name == "cuda") return make_cuda_backend();
    throw Error("unknown backend '" + name + "' (this build has: cpu, cuda)");
#else
    if (name == "cuda") throw Error("backend 'cuda': this build has no CUDA backend (nvcc was not found when it was configured)");
    throw Error("unknown backend '" + name + "' (this build has: cpu)");
#endif
}

}  // namespace alloy
