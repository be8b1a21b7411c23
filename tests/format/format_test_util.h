// Helpers shared by the format tests: a little-endian byte builder for hand-made
// (and deliberately broken) files, temp paths, and an "expect alloy::Error mentioning X" check.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "alloy/error.h"

namespace alloy::test {

struct Bytes {
    std::vector<uint8_t> b;
    Bytes& u8(uint8_t v) { return raw(&v, 1); }
    Bytes& u16(uint16_t v) { return raw(&v, 2); }
    Bytes& u32(uint32_t v) { return raw(&v, 4); }
    Bytes& u64(uint64_t v) { return raw(&v, 8); }
    Bytes& f32(float v) { return raw(&v, 4); }
    Bytes& f64(double v) { return raw(&v, 8); }
    Bytes& str(const std::string& s) {  // gguf string: u64 length + bytes
        u64(s.size());
        return raw(s.data(), s.size());
    }
    Bytes& raw(const void* p, size_t n) {
        const uint8_t* c = static_cast<const uint8_t*>(p);
        b.insert(b.end(), c, c + n);
        return *this;
    }
    Bytes& append(const Bytes& o) { return raw(o.b.data(), o.b.size()); }
    size_t size() const { return b.size(); }
};

inline std::string temp_path(const std::string& name) {
    return ::testing::TempDir() + "alloy_fmt_" + std::to_string(::getpid()) + "_" + name;
}

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(f.good()) << path;
}

inline std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Runs fn, which must throw alloy::Error whose message contains every string in `parts`.
// Returns the message (empty if it did not throw).
inline std::string expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
    try {
        fn();
    } catch (const alloy::Error& e) {
        const std::string msg = e.what();
        for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
        return msg;
    }
    ADD_FAILURE() << "no alloy::Error thrown (expected one mentioning '" << (parts.empty() ? "" : parts[0]) << "')";
    return "";
}

}  // namespace alloy::test
