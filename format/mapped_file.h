// Read-only whole-file mmap shared by the GGUF and safetensors readers.
#pragma once
#include <cstddef>
#include <string>

namespace alloy {

// Maps `path` read-only (MAP_PRIVATE) and sets `size`. An empty file maps to nullptr with
// size 0. Throws alloy::Error naming the path if it cannot be opened or is not a regular file.
void* map_file(const std::string& path, size_t& size);
// Opens `path` read-only and returns its descriptor (the caller closes it) and, if asked, its
// size; throws alloy::Error naming the path if it cannot be opened or is not a regular file.
int open_regular_file(const std::string& path, size_t* size = nullptr);
void unmap_file(void* p, size_t size);

}  // namespace alloy
