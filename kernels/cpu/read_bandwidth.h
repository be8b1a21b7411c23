// A read-bandwidth probe: how fast this machine streams memory right now, measured with the
// kernels' own thread pool on a buffer the caller already holds (e.g. a weight tensor that is
// larger than the last-level cache), so that `bench` can state decode speed as a share of the
// bandwidth floor measured in the same run instead of against a figure from another day (the
// shared host's bandwidth moves by tens of percent between runs).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace alloy::cpu {

struct ReadBandwidth {
    double gb_per_s = 0;  // the best layout's median pass
    int streams = 0;      // memory streams per thread of the best layout
    uint64_t checksum = 0;  // XOR of every word read, over all passes (keeps the reads real)
    size_t bytes_read = 0;  // bytes per pass: `bytes` rounded down to whole stream blocks
};

// Reads [data, data + bytes) `passes` times per layout (1, 2, 4 and 8 streams per thread,
// each thread a contiguous share), summing 64-byte lines so nothing is optimized away.
// bytes should be well above the last-level cache; pages not yet resident are faulted in by
// the first pass, which is therefore not timed.
ReadBandwidth measure_read_bandwidth(const void* data, size_t bytes, int passes = 3);

// The same over several regions read as one: each span rounded down to whole 512-byte blocks,
// the threads splitting the concatenation into equal contiguous shares. `bench` passes the
// model's weights, i.e. the bytes a decode step streams, so that the floor is stated with the
// cache behaviour of the step itself (a single tensor can fit in a large last-level cache and
// read faster than the step's whole working set ever does).
struct ByteSpan {
    const void* data;
    size_t bytes;
};
ReadBandwidth measure_read_bandwidth(const std::vector<ByteSpan>& spans, int passes = 3);

}  // namespace alloy::cpu
