// A caller's workspace for the tests of the ops' workspace entry points (kernels/cpu/
// workspace.h): exactly the byte count the op gave, NaN-filled (an op that reads scratch it did
// not write poisons its result), starting 4 bytes past a 64-byte boundary (the op aligns its
// sections itself), followed by a canary the op must leave as it was (it stays within its count).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace alloy::test {

class GuardedWorkspace {
public:
    explicit GuardedWorkspace(size_t bytes) : bytes_(bytes), buf_(kOffset + bytes + kCanary + 64) {
        const uintptr_t a = (reinterpret_cast<uintptr_t>(buf_.data()) + 63) & ~uintptr_t(63);
        p_ = reinterpret_cast<uint8_t*>(a) + kOffset;
        const float nan = std::numeric_limits<float>::quiet_NaN();
        for (size_t i = 0; i + sizeof(float) <= bytes_; i += sizeof(float)) std::memcpy(p_ + i, &nan, sizeof(float));
        for (size_t i = 0; i < kCanary; ++i) p_[bytes_ + i] = uint8_t(0xA5 ^ i);
    }
    void* get() { return p_; }
    size_t bytes() const { return bytes_; }
    bool canary_intact() const {
        for (size_t i = 0; i < kCanary; ++i)
            if (p_[bytes_ + i] != uint8_t(0xA5 ^ i)) return false;
        return true;
    }

private:
    static constexpr size_t kOffset = 4, kCanary = 4096;
    size_t bytes_;
    std::vector<uint8_t> buf_;
    uint8_t* p_ = nullptr;
};

}  // namespace alloy::test
