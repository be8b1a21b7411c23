#include "runtime/cuda/nccl_collective.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <vector>
#include <mutex>
#include <string>

#include "alloy/error.h"

namespace alloy {

namespace {

// The entry points used, from libnccl.so.2 (its nccl.h declares them; this file only calls
// through pointers so that the link needs no libnccl).
struct Nccl {
    decltype(&ncclCommInitAll) comm_init_all = nullptr;
    decltype(&ncclCommDestroy) comm_destroy = nullptr;
    decltype(&ncclAllReduce) all_reduce = nullptr;
    decltype(&ncclGetErrorString) error_string = nullptr;
    decltype(&ncclGetVersion) get_version = nullptr;
    decltype(&ncclGroupStart) group_start = nullptr;
    decltype(&ncclGroupEnd) group_end = nullptr;

    static const Nccl& get() {
        static std::once_flag once;
        static Nccl n;
        static std::string why;
        std::call_once(once, [] {
            void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
            if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
            if (!h) {
                const char* e = dlerror();
                why = std::string("cannot load libnccl.so.2 (") + (e ? e : "not found") +
                      "): install NCCL or put its lib folder on LD_LIBRARY_PATH";
                return;
            }
            auto sym = [&](auto& f, const char* name) {
                f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(h, name));
                if (!f && why.empty()) why = std::string("libnccl.so.2 has no ") + name;
            };
            sym(n.comm_init_all, "ncclCommInitAll");
            sym(n.comm_destroy, "ncclCommDestroy");
            sym(n.all_reduce, "ncclAllReduce");
            sym(n.error_string, "ncclGetErrorString");
            sym(n.get_version, "ncclGetVersion");
            sym(n.group_start, "ncclGroupStart");
            sym(n.group_end, "ncclGroupEnd");
        });
        if (!why.empty()) throw Error("nccl: " + why);
        return n;
    }
    void check(ncclResult_t r, const std::string& what) const {
        if (r != ncclSuccess) throw Error("nccl: " + what + ": " + error_string(r));
    }
};

// The communicators of one group, destroyed together once no rank uses them.
struct Comms {
    std::vector<ncclComm_t> comms;
    ~Comms() {
        const Nccl& n = Nccl::get();
        for (ncclComm_t c : comms)
            if (c) n.comm_destroy(c);
    }
};

class NcclCollective final : public Collective {
public:
    NcclCollective(std::shared_ptr<Comms> comms, int rank) : comms_(std::move(comms)), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return int(comms_->comms.size()); }
    void all_reduce_sum(float* data, size_t n, void* stream) override {
        const Nccl& nc = Nccl::get();
        nc.check(nc.all_reduce(data, data, n, ncclFloat32, ncclSum, comms_->comms[size_t(rank_)], cudaStream_t(stream)),
                 "all-reduce of " + std::to_string(n) + " floats on rank " + std::to_string(rank_));
    }

private:
    std::shared_ptr<Comms> comms_;
    int rank_;
};

}  // namespace

namespace {

class HostStagedCollective final : public Collective {
public:
    explicit HostStagedCollective(std::shared_ptr<Collective> host) : host_(std::move(host)) {}
    int rank() const override { return host_->rank(); }
    int size() const override { return host_->size(); }
    void begin_step() override { host_->begin_step(); }  // the host group's turns (its sums expect them)
    void end_step() override { host_->end_step(); }
    void all_reduce_sum(float* data, size_t n, void* stream) override {
        const cudaStream_t st = cudaStream_t(stream);
        cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing(st, &cap);
        // Refused before any rank posts anything: every rank's recording fails the same way.
        if (cap != cudaStreamCaptureStatusNone) throw Error("host-staged all-reduce: not capturable into a CUDA graph");
        buf_.resize(n);
        auto check = [&](cudaError_t e, const char* what) {
            if (e != cudaSuccess) throw Error(std::string("host-staged all-reduce: ") + what + ": " + cudaGetErrorString(e));
        };
        check(cudaMemcpyAsync(buf_.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost, st), "copy out");
        check(cudaStreamSynchronize(st), "copy out");
        host_->all_reduce_sum(buf_.data(), n, nullptr);
        check(cudaMemcpyAsync(data, buf_.data(), n * sizeof(float), cudaMemcpyHostToDevice, st), "copy back");
        check(cudaStreamSynchronize(st), "copy back");
    }

private:
    std::shared_ptr<Collective> host_;
    std::vector<float> buf_;
};

}  // namespace

std::vector<std::shared_ptr<Collective>> make_host_staged_collectives(int n) {
    std::vector<std::shared_ptr<Collective>> out;
    for (auto& h : make_host_collectives(n)) out.push_back(std::make_shared<HostStagedCollective>(h));
    return out;
}

std::vector<std::shared_ptr<Collective>> make_nccl_collectives(int n) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
    if (n < 1 || n > devices)
        throw Error("nccl: " + std::to_string(n) + " GPUs asked for; this machine has " + std::to_string(devices));
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // see the header
    const Nccl& nc = Nccl::get();
    auto comms = std::make_shared<Comms>();
    comms->comms.assign(size_t(n), nullptr);
    std::vector<int> devs(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) devs[size_t(i)] = i;
    nc.check(nc.comm_init_all(comms->comms.data(), n, devs.data()), "init of " + std::to_string(n) + " communicators");
    // One all-reduce now, from this thread over every GPU (a group call): NCCL connects the ranks
    // at their first collective, which must not be inside a CUDA graph capture (a decode plan's).
    int current = 0;
    cudaGetDevice(&current);
    std::vector<float*> bufs(static_cast<size_t>(n), nullptr);
    auto cuda_check = [](cudaError_t e, const char* what) {
        if (e != cudaSuccess) throw Error(std::string("nccl warm-up: ") + what + ": " + cudaGetErrorString(e));
    };
    for (int i = 0; i < n; ++i) {
        cuda_check(cudaSetDevice(i), "set device");
        cuda_check(cudaMalloc(&bufs[size_t(i)], 64 * sizeof(float)), "allocation");
        cuda_check(cudaMemset(bufs[size_t(i)], 0, 64 * sizeof(float)), "memset");
    }
    nc.check(nc.group_start(), "group start");
    for (int i = 0; i < n; ++i) {
        cuda_check(cudaSetDevice(i), "set device");
        nc.check(nc.all_reduce(bufs[size_t(i)], bufs[size_t(i)], 64, ncclFloat32, ncclSum, comms->comms[size_t(i)], nullptr),
                 "warm-up all-reduce");
    }
    nc.check(nc.group_end(), "group end");
    for (int i = 0; i < n; ++i) {
        cuda_check(cudaSetDevice(i), "set device");
        cuda_check(cudaDeviceSynchronize(), "warm-up");
        cudaFree(bufs[size_t(i)]);
    }
    cudaSetDevice(current);
    std::vector<std::shared_ptr<Collective>> out;
    for (int r = 0; r < n; ++r) out.push_back(std::make_shared<NcclCollective>(comms, r));
    return out;
}

}  // namespace alloy
