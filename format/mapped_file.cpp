#include "format/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "alloy/error.h"

namespace alloy {

int open_regular_file(const std::string& path, size_t* size) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw Error(path + ": not a regular file");
    }
    if (size) *size = static_cast<size_t>(st.st_size);
    return fd;
}

void* map_file(const std::string& path, size_t& size) {
    const int fd = open_regular_file(path, &size);
    void* m = nullptr;
    if (size > 0) {  // mmap rejects length 0
        m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            throw Error(path + ": mmap failed: " + std::strerror(err));
        }
    }
    ::close(fd);  // the mapping stays valid after close
    return m;
}

void unmap_file(void* p, size_t size) {
    if (p) munmap(p, size);
}

}  // namespace alloy
