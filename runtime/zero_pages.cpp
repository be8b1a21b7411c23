#include "runtime/zero_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "alloy/error.h"

namespace alloy {

ZeroPages::ZeroPages(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        bytes_ = 0;
        throw Error("cannot map " + std::to_string(bytes) + " bytes of memory (KV cache too large for --ctx?)");
    }
    data_ = p;
}

ZeroPages::~ZeroPages() {
    if (data_) munmap(data_, bytes_);
}

ZeroPages::ZeroPages(ZeroPages&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

ZeroPages& ZeroPages::operator=(ZeroPages&& o) noexcept {
    if (this != &o) {
        if (data_) munmap(data_, bytes_);
        data_ = std::exchange(o.data_, nullptr);
        bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
}

size_t ZeroPages::resident_bytes() const {
    if (!data_) return 0;
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> v((bytes_ + page - 1) / page);
    if (mincore(data_, bytes_, v.data()) != 0) return 0;
    size_t n = 0;
    for (unsigned char c : v) n += c & 1;
    return n * page;
}

}  // namespace alloy
