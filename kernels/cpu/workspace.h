// Scratch memory from the caller (../shared/DESIGN.md: "workspace from the caller"), as the
// CUDA ops take it (kernels/cuda/ops.h): an op with scratch has `size_t X_workspace_bytes(<shape>)`
// and an overload taking `void* workspace` of at least that many bytes, which a recorded plan
// allocates once (runtime/cpu_backend.cpp). Any alignment: the op aligns its sections to
// 64 bytes itself (the byte count includes that slack). Contents are undefined on entry and on
// return; no op keeps data in it between calls.
//
// Sections that each pool thread uses on its own (a block's tiles, a row buffer) are cut into
// n_threads() slices, indexed by the thread argument of parallel_for, so a byte count holds for
// the pool size at the time it is asked (a caller that resizes the pool asks again).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace alloy::cpu {

namespace ws {

constexpr size_t kAlign = 64;
inline size_t up(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

// Cuts 64-byte aligned sections out of a workspace in order. With a null base it only counts,
// so one function can give both an op's byte count (bytes()) and its layout.
class Carver {
public:
    explicit Carver(void* base = nullptr)
        : base_(base ? reinterpret_cast<uint8_t*>(up(reinterpret_cast<uintptr_t>(base))) : nullptr) {}
    template <class T>
    T* take(size_t count) {
        T* r = base_ ? reinterpret_cast<T*>(base_ + off_) : nullptr;
        off_ += up(count * sizeof(T));
        return r;
    }
    // Bytes a workspace needs for the sections taken so far, alignment slack of its base included.
    size_t bytes() const { return off_ + kAlign; }

private:
    uint8_t* base_;
    size_t off_ = 0;
};

}  // namespace ws

// A caller-owned workspace that grows to the largest call it has served (tests, the
// convenience overloads' callers that repeat calls). Uninitialised memory.
class ScratchBuffer {
public:
    void* get(size_t bytes) {
        if (bytes > size_) {
            p_.reset();  // free first: the peak is one buffer, not two
            p_.reset(new uint8_t[bytes]);
            size_ = bytes;
        }
        return p_.get();
    }

private:
    std::unique_ptr<uint8_t[]> p_;
    size_t size_ = 0;
};

}  // namespace alloy::cpu
