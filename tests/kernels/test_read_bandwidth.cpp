// kernels/cpu/read_bandwidth.h: the probe `bench` uses to state decode speed against the
// bandwidth measured in the same run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/read_bandwidth.h"
#include "kernels/cpu/thread_pool.h"

namespace {

// The bandwidth probe reads every word of the (rounded) buffer on every pass: 1 untimed pass +
// 4 layouts x 3 passes = 13 reads of each word, an odd count, so the XOR checksum equals the XOR
// of the words once. Random contents (never zeros), odd sizes, 1 and 2 threads.
TEST(ReadBandwidth, ReadsEveryWordAndReportsARate) {
    std::mt19937_64 rng(3);
    for (size_t bytes : {size_t(1) << 20, (size_t(3) << 20) + 4104}) {
        std::vector<uint64_t> buf(bytes / 8 + 1);
        for (auto& w : buf) w = rng();
        for (int threads : {1, 2}) {
            const int saved = alloy::cpu::n_threads();
            alloy::cpu::set_n_threads(threads);
            const alloy::cpu::ReadBandwidth bw = alloy::cpu::measure_read_bandwidth(buf.data(), bytes, 3);
            alloy::cpu::set_n_threads(saved);
            ASSERT_GT(bw.bytes_read, bytes - size_t(threads) * 512);
            ASSERT_LE(bw.bytes_read, bytes);
            uint64_t want = 0;
            for (size_t i = 0; i < bw.bytes_read / 8; ++i) want ^= buf[i];
            EXPECT_EQ(bw.checksum, want) << bytes << " bytes, " << threads << " threads";
            EXPECT_GT(bw.gb_per_s, 0.0);
            EXPECT_TRUE(bw.streams == 1 || bw.streams == 2 || bw.streams == 4 || bw.streams == 8);
        }
    }
}

// Several regions read as one (bench's whole-weights probe): odd sizes, one below a 512-byte
// block (skipped), random contents; the checksum is the XOR of the words of the first
// bytes_read bytes of the spans' concatenation, each span rounded down to whole blocks.
TEST(ReadBandwidth, ReadsSpansAsOneRegion) {
    std::mt19937_64 rng(5);
    const std::vector<size_t> sizes = {(size_t(1) << 20) + 8, 300, (size_t(2) << 20) + 4096 + 520, 777 * 512};
    std::vector<std::vector<uint64_t>> bufs;
    std::vector<alloy::cpu::ByteSpan> spans;
    for (size_t bytes : sizes) {
        bufs.emplace_back(bytes / 8 + 1);
        for (auto& w : bufs.back()) w = rng();
        spans.push_back({bufs.back().data(), bytes});
    }
    for (int threads : {1, 2}) {
        const int saved = alloy::cpu::n_threads();
        alloy::cpu::set_n_threads(threads);
        const alloy::cpu::ReadBandwidth bw = alloy::cpu::measure_read_bandwidth(spans, 3);
        alloy::cpu::set_n_threads(saved);
        size_t rounded = 0;
        for (size_t bytes : sizes) rounded += bytes / 512 * 512;
        ASSERT_GT(bw.bytes_read, rounded - size_t(threads) * 512);
        ASSERT_EQ(bw.bytes_read % (size_t(threads) * 512), 0u);
        uint64_t want = 0;
        size_t left = bw.bytes_read / 8;
        for (size_t i = 0; i < sizes.size() && left > 0; ++i) {
            const size_t words = std::min(left, sizes[i] / 512 * 64);
            for (size_t w = 0; w < words; ++w) want ^= bufs[i][w];
            left -= words;
        }
        EXPECT_EQ(bw.checksum, want) << threads << " threads";
        EXPECT_GT(bw.gb_per_s, 0.0);
    }
}

}  // namespace
