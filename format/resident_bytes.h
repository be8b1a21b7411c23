// A byte range of a file read into anonymous memory backed by 2 MiB pages where the kernel
// grants them (madvise(MADV_HUGEPAGE), which works in the "madvise" THP mode Debian ships).
//
// Why not the file mapping: decode streams every weight from memory once per token, and a
// stream over 4 KiB page-cache pages costs a TLB miss and page walk per page. Measured on the
// 0.8B BF16 LM head (508 MB GEMV, 2 threads, 2026-11-30): 46-51 GB/s through the mapping, 51-57
// in anonymous 4 KiB pages and 54-61 in 2 MiB pages while the host's memory was in its fast
// phase; 28-33 for all three in the slow phase. llama.cpp's --no-mmap likewise reads the
// weights into anonymous memory (without asking for huge pages).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace alloy {

class ResidentBytes {
public:
    ResidentBytes() = default;
    // Reads [offset, offset + size) of `path`. Throws alloy::Error naming the path and offset
    // when the file cannot be opened, read, or is shorter than the range.
    static ResidentBytes read(const std::string& path, uint64_t offset, size_t size);
    ~ResidentBytes();
    ResidentBytes(ResidentBytes&& o) noexcept;
    ResidentBytes& operator=(ResidentBytes&& o) noexcept;
    ResidentBytes(const ResidentBytes&) = delete;
    ResidentBytes& operator=(const ResidentBytes&) = delete;

    // MemAvailable of /proc/meminfo (what can be allocated without swapping, page cache
    // included), or 0 when it cannot be read.
    static uint64_t available_memory();

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }

private:
    void release();
    void* map_ = nullptr;     // the anonymous mapping (larger than size_, for the alignment)
    size_t map_size_ = 0;
    uint8_t* data_ = nullptr;  // 2 MiB-aligned start inside map_
    size_t size_ = 0;
};

}  // namespace alloy
