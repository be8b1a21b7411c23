#include "format/resident_bytes.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "alloy/error.h"
#include "format/mapped_file.h"

namespace alloy {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kReadChunk = size_t(64) << 20;  // one pread per 64 MiB

}  // namespace

ResidentBytes ResidentBytes::read(const std::string& path, uint64_t offset, size_t size) {
    ResidentBytes r;
    if (size == 0) return r;
    const size_t rounded = (size + kHugePage - 1) / kHugePage * kHugePage;
    r.map_size_ = rounded + kHugePage;  // room to align the start to a 2 MiB boundary
    r.map_ = mmap(nullptr, r.map_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r.map_ == MAP_FAILED) {
        r.map_ = nullptr;
        throw Error(path + ": cannot allocate " + std::to_string(size) + " bytes for the tensor data: " +
                    std::strerror(errno));
    }
    r.data_ = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(r.map_) + kHugePage - 1) & ~(kHugePage - 1));
    r.size_ = size;
    madvise(r.data_, rounded, MADV_HUGEPAGE);  // a hint: without THP the copy still works

    const int fd = open_regular_file(path);
    // Most of a load is the kernel clearing the new pages as the reads fault them in, which
    // runs on the faulting thread: a few threads, each reading its own 2 MiB-aligned share,
    // divide that time.
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    const size_t n_parts = std::min<size_t>({hw, 8, rounded / kHugePage});
    const size_t share = (rounded / kHugePage + n_parts - 1) / n_parts * kHugePage;
    std::vector<std::string> errors(n_parts);
    auto read_part = [&](size_t p) {
        const size_t end = std::min(size, (p + 1) * share);
        for (size_t done = std::min(size, p * share); done < end;) {
            const ssize_t n = pread(fd, r.data_ + done, std::min(kReadChunk, end - done), off_t(offset + done));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                errors[p] = path + ": reading tensor data at byte " + std::to_string(offset + done) + ": " +
                            (n < 0 ? std::strerror(errno) : "unexpected end of file");
                return;
            }
            done += size_t(n);
        }
    };
    std::vector<std::thread> helpers;
    for (size_t p = 1; p < n_parts; ++p) helpers.emplace_back(read_part, p);
    read_part(0);
    for (auto& t : helpers) t.join();
    ::close(fd);
    for (const std::string& e : errors)
        if (!e.empty()) throw Error(e);
    return r;
}

uint64_t ResidentBytes::available_memory() {
    FILE* f = std::fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    uint64_t kb = 0;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "MemAvailable: %lu kB", &kb) == 1) break;
    std::fclose(f);
    return kb * 1024;
}

void ResidentBytes::release() {
    if (map_) munmap(map_, map_size_);
    map_ = nullptr;
    data_ = nullptr;
    map_size_ = size_ = 0;
}

ResidentBytes::~ResidentBytes() { release(); }

ResidentBytes::ResidentBytes(ResidentBytes&& o) noexcept
    : map_(std::exchange(o.map_, nullptr)), map_size_(std::exchange(o.map_size_, 0)),
      data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

ResidentBytes& ResidentBytes::operator=(ResidentBytes&& o) noexcept {
    if (this != &o) {
        release();
        map_ = std::exchange(o.map_, nullptr);
        map_size_ = std::exchange(o.map_size_, 0);
        data_ = std::exchange(o.data_, nullptr);
        size_ = std::exchange(o.size_, 0);
    }
    return *this;
}

}  // namespace alloy
