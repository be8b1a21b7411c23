// Zero-initialised memory whose pages the OS backs only when first touched: an anonymous
// private mapping. The KV cache of a sequence is sized for n_ctx rows but only its first
// n_past rows are ever written or read, so the rest costs no resident memory (a zero-filled
// std::vector would write, and so back, every page of it).
#pragma once
#include <cstddef>

namespace alloy {

class ZeroPages {
public:
    ZeroPages() = default;
    explicit ZeroPages(size_t bytes);  // throws alloy::Error naming the size when the mapping fails
    ~ZeroPages();
    ZeroPages(ZeroPages&& o) noexcept;
    ZeroPages& operator=(ZeroPages&& o) noexcept;
    ZeroPages(const ZeroPages&) = delete;
    ZeroPages& operator=(const ZeroPages&) = delete;

    void* data() { return data_; }
    const void* data() const { return data_; }
    size_t bytes() const { return bytes_; }
    // Pages of [0, bytes) that are resident now (mincore); for tests and memory reports.
    size_t resident_bytes() const;

private:
    void* data_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace alloy
