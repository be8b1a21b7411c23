// A generator of deliberately broken GGUF files: each must be rejected with alloy::Error
// naming the field (never a crash, never another exception type).
#include <gtest/gtest.h>

#include <optional>
#include <random>

#include "format/gguf.h"
#include "format_test_util.h"

namespace alloy::gguf {
namespace {

using test::Bytes;
using test::expect_error;

constexpr uint32_t kMagic = 0x46554747;
constexpr uint64_t kHuge = uint64_t{1} << 62;

// Typed value encodings (value type id + payload).
Bytes v_u32(uint32_t v) { return std::move(Bytes().u32(4).u32(v)); }
Bytes v_i32(int32_t v) { return std::move(Bytes().u32(5).u32(static_cast<uint32_t>(v))); }
Bytes v_str(const std::string& s) { return std::move(Bytes().u32(8).str(s)); }

struct RawTensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type = 0;
    uint64_t offset = 0;
    std::optional<uint32_t> n_dims;  // defaults to ne.size()
};

// A GGUF file described field by field, so each test can break exactly one thing.
struct RawGguf {
    uint32_t magic = kMagic;
    uint32_t version = 3;
    std::optional<uint64_t> tensor_count, kv_count;  // default: the real counts
    std::vector<std::pair<std::string, Bytes>> kvs;
    std::vector<RawTensor> tensors;
    uint32_t alignment = 32;        // used for the padding only
    std::optional<uint64_t> data_size;  // default: end of the furthest tensor

    static RawGguf valid() {
        RawGguf g;
        g.kv("general.architecture", v_str("qwen35"));
        g.kv("test.n", v_u32(7));
        g.kv("test.list", Bytes().u32(9).u32(5).u64(3).u32(1).u32(2).u32(3));
        g.kv("test.tokens", Bytes().u32(9).u32(8).u64(3).str("a").str("bc").str(""));
        g.kv("test.flag", Bytes().u32(7).u8(1));
        g.tensors.push_back({"a.weight", {5, 3}, 0, 0, {}});   // f32, 60 bytes
        g.tensors.push_back({"b.weight", {64, 2}, 8, 64, {}});  // q8_0, 136 bytes
        return g;
    }
    RawGguf& kv(const std::string& key, Bytes value) {
        kvs.emplace_back(key, std::move(value));
        return *this;
    }

    std::vector<uint8_t> build() const {
        Bytes b;
        b.u32(magic).u32(version);
        b.u64(tensor_count.value_or(tensors.size())).u64(kv_count.value_or(kvs.size()));
        for (const auto& [k, v] : kvs) b.str(k).append(v);
        uint64_t end = 0;
        for (const RawTensor& t : tensors) {
            b.str(t.name).u32(t.n_dims.value_or(static_cast<uint32_t>(t.ne.size())));
            for (uint64_t d : t.ne) b.u64(d);
            b.u32(t.type).u64(t.offset);
            if (type_supported(t.type) && t.ne.size() <= 4) {
                uint64_t n = 1;
                for (uint64_t d : t.ne) n = d > 1000000 ? 0 : n * d;
                const TypeTraits& tr = type_traits(static_cast<GgmlType>(t.type));
                if (n > 0 && t.offset < 100000) end = std::max(end, t.offset + n / tr.block_elems * tr.block_bytes);
            }
        }
        while (b.size() % alignment) b.u8(0);
        const uint64_t n = data_size.value_or(end);
        for (uint64_t i = 0; i < n; ++i) b.u8(static_cast<uint8_t>(i * 37 + 11));
        return b.b;
    }
};

std::unique_ptr<File> parse(const std::vector<uint8_t>& bytes) {
    return File::parse(bytes.data(), bytes.size(), "broken.gguf");
}

void expect_broken(const RawGguf& g, const std::vector<std::string>& parts) {
    const std::vector<uint8_t> bytes = g.build();
    std::vector<std::string> all = parts;
    all.insert(all.begin(), "broken.gguf: ");
    expect_error([&] { parse(bytes); }, all);
}

TEST(GgufBroken, BaseFileIsValid) {
    const std::vector<uint8_t> bytes = RawGguf::valid().build();
    auto f = parse(bytes);
    EXPECT_EQ(f->get_string("general.architecture"), "qwen35");
    EXPECT_EQ(f->get_int_array("test.list"), (std::vector<int64_t>{1, 2, 3}));
    EXPECT_EQ(f->get_string_array("test.tokens"), (std::vector<std::string>{"a", "bc", ""}));
    ASSERT_EQ(f->tensors().size(), 2u);
    EXPECT_EQ(f->tensor("b.weight").nbytes, 136u);
    EXPECT_EQ(f->tensor("b.weight").data + 136, bytes.data() + bytes.size());  // ends exactly at EOF
}

TEST(GgufBroken, TruncatedAtEveryByte) {
    const std::vector<uint8_t> full = RawGguf::valid().build();
    for (size_t cut = 0; cut < full.size(); ++cut) {
        const std::vector<uint8_t> part(full.begin(), full.begin() + static_cast<ptrdiff_t>(cut));
        try {
            File::parse(part.data(), part.size(), "cut.gguf");
            FAIL() << "prefix of " << cut << " bytes parsed";
        } catch (const Error& e) {
            ASSERT_EQ(std::string(e.what()).rfind("cut.gguf: ", 0), 0u) << e.what();
            ASSERT_NE(std::string(e.what()).find(" at offset "), std::string::npos) << e.what();
        }
    }
}

TEST(GgufBroken, RandomBitFlipsParseOrThrow) {
    const std::vector<uint8_t> full = RawGguf::valid().build();
    const size_t header_end = full.size() - 200;  // the data section is the last 200 bytes
    std::mt19937 rng(1234);
    int parsed = 0, rejected = 0;
    for (int iter = 0; iter < 20000; ++iter) {
        std::vector<uint8_t> b = full;
        const int flips = 1 + static_cast<int>(rng() % 3);
        for (int k = 0; k < flips; ++k) {
            const size_t pos = rng() % (iter % 4 == 0 ? b.size() : header_end);
            b[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
        }
        try {
            auto f = File::parse(b.data(), b.size(), "flip.gguf");
            // Touch everything the reader handed out.
            unsigned sum = 0;
            for (const TensorInfo& t : f->tensors()) {
                for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
            }
            for (const auto& [k, v] : f->metadata()) sum += static_cast<unsigned>(k.size() + v.array_size());
            EXPECT_GT(sum, 0u);
            ++parsed;
        } catch (const Error&) {
            ++rejected;
        }
    }
    EXPECT_GT(parsed, 0);
    EXPECT_GT(rejected, 0);
}

TEST(GgufBroken, Header) {
    RawGguf g = RawGguf::valid();
    g.magic = 0x46554746;
    expect_broken(g, {"magic at offset 0", "GGUF"});
    g = RawGguf::valid();
    g.version = 4;
    expect_broken(g, {"version at offset 4", "unsupported version 4"});
    g.version = 1;
    expect_broken(g, {"version at offset 4", "version 1"});
    g.version = 0x03000000;
    expect_broken(g, {"version", "big-endian"});
    g = RawGguf::valid();
    g.version = 2;  // v2 has the same layout
    EXPECT_EQ(parse(g.build())->version(), 2u);
    g = RawGguf::valid();
    g.tensor_count = kHuge;
    expect_broken(g, {"tensor_count at offset 8", "4611686018427387904"});
    g = RawGguf::valid();
    g.kv_count = kHuge;
    expect_broken(g, {"kv_count at offset 16", "4611686018427387904"});
    g = RawGguf::valid();
    g.kv_count = ~uint64_t{0};
    expect_broken(g, {"kv_count"});
    g = RawGguf::valid();
    g.tensor_count = 3;  // one more tensor info than present
    expect_broken(g, {"tensor #2"});
}

TEST(GgufBroken, Strings) {
    // A key whose length field is huge: built by hand since the key comes first.
    std::vector<uint8_t> b = RawGguf::valid().build();
    const uint64_t huge = kHuge;
    std::memcpy(b.data() + 24, &huge, 8);
    expect_error([&] { parse(b); }, {"key #0 at offset 24", "string length 4611686018427387904"});
    RawGguf g = RawGguf::valid();
    g.kv("test.s", Bytes().u32(8).u64(kHuge));
    expect_broken(g, {"key 'test.s'", "string length"});
    g = RawGguf::valid();
    g.tensors[1].name = std::string(5000, 'n');  // fine by itself ...
    g.data_size = 0;                             // ... but then the data is missing
    expect_broken(g, {"past end of file"});
}

TEST(GgufBroken, Arrays) {
    RawGguf g = RawGguf::valid();
    g.kv("test.arr", Bytes().u32(9).u32(6).u64(kHuge));
    expect_broken(g, {"key 'test.arr'", "array of 4611686018427387904 float32"});
    g = RawGguf::valid();
    g.kv("test.sarr", Bytes().u32(9).u32(8).u64(kHuge));
    expect_broken(g, {"key 'test.sarr'", "strings cannot fit"});
    g = RawGguf::valid();
    g.kv("test.sarr", Bytes().u32(9).u32(8).u64(2).str("ok").u64(kHuge));
    expect_broken(g, {"key 'test.sarr'", "string element 1"});
    g = RawGguf::valid();
    g.kv("test.nested", Bytes().u32(9).u32(9).u64(1).u32(4).u64(1).u32(5));
    expect_broken(g, {"key 'test.nested'", "nested"});
    g = RawGguf::valid();
    g.kv("test.elem", Bytes().u32(9).u32(13).u64(1).u32(0));
    expect_broken(g, {"key 'test.elem'", "unknown array element type 13"});
    g = RawGguf::valid();
    g.kv("test.bools", Bytes().u32(9).u32(7).u64(2).u8(1).u8(2));
    expect_broken(g, {"key 'test.bools'", "bool element 1"});
}

TEST(GgufBroken, Values) {
    RawGguf g = RawGguf::valid();
    g.kv("test.unknown", Bytes().u32(13).u32(0));
    expect_broken(g, {"key 'test.unknown'", "unknown value type 13"});
    g = RawGguf::valid();
    g.kv("test.unknown", Bytes().u32(0xFFFFFFFF));
    expect_broken(g, {"key 'test.unknown'", "unknown value type 4294967295"});
    g = RawGguf::valid();
    g.kv("test.bool", Bytes().u32(7).u8(3));
    expect_broken(g, {"key 'test.bool'", "bool value 3"});
    g = RawGguf::valid();
    g.kv("test.n", v_u32(8));
    expect_broken(g, {"key 'test.n'", "duplicate key"});
    g = RawGguf::valid();
    g.kv("test.cut", Bytes().u32(12).u32(0));  // float64 with only 4 bytes: runs into the tensor infos
    g.tensors.clear();
    g.data_size = 0;
    g.alignment = 1;
    expect_broken(g, {"key 'test.cut'", "truncated"});
}

TEST(GgufBroken, Alignment) {
    for (uint32_t a : {0u, 3u, 48u}) {
        RawGguf g = RawGguf::valid();
        g.kv("general.alignment", v_u32(a));
        expect_broken(g, {"key 'general.alignment'", std::to_string(a), "power of two"});
    }
    RawGguf g = RawGguf::valid();
    g.kv("general.alignment", v_i32(64));
    expect_broken(g, {"key 'general.alignment'", "expected uint32, got int32"});
    g = RawGguf::valid();
    g.kv("general.alignment", v_u32(64));  // the 64-byte offset of b.weight still fits ...
    g.alignment = 64;
    EXPECT_EQ(parse(g.build())->alignment(), 64u);
    g.kvs.back().second = v_u32(128);  // ... but not 128
    g.alignment = 128;
    expect_broken(g, {"tensor 'b.weight'", "offset 64 is not a multiple of the alignment 128"});
}

TEST(GgufBroken, TensorDims) {
    for (uint32_t n : {0u, 5u}) {
        RawGguf g = RawGguf::valid();
        g.tensors[0].n_dims = n;
        expect_broken(g, {"tensor 'a.weight'", "n_dims " + std::to_string(n)});
    }
    RawGguf g = RawGguf::valid();
    g.tensors[0].ne = {uint64_t{1} << 32, uint64_t{1} << 32};
    expect_broken(g, {"tensor 'a.weight'", "overflows"});
    g = RawGguf::valid();
    g.tensors[0].ne = {3, uint64_t{1} << 31, uint64_t{1} << 31, 4};
    expect_broken(g, {"tensor 'a.weight'", "overflows"});
    g = RawGguf::valid();
    g.tensors[0].ne = {uint64_t{1} << 61, 1};  // element count fits int64 but bytes (x4) overflow
    expect_broken(g, {"tensor 'a.weight'"});
    g = RawGguf::valid();
    g.tensors[0].ne = {5, ~uint64_t{0}};  // -1 as int64
    expect_broken(g, {"tensor 'a.weight'", "ne[1] = 18446744073709551615 is negative"});
    g = RawGguf::valid();
    g.tensors[0].ne = {5, uint64_t{1} << 63};
    expect_broken(g, {"tensor 'a.weight'", "negative"});
    g = RawGguf::valid();
    g.tensors[1].ne = {33, 2};
    expect_broken(g, {"tensor 'b.weight'", "ne[0] = 33", "q8_0 block size 32"});
    g = RawGguf::valid();
    g.tensors[1].type = 12;  // q4_K: 64 is not a multiple of 256
    expect_broken(g, {"tensor 'b.weight'", "q4_K block size 256"});
}

TEST(GgufBroken, TensorTypes) {
    for (uint32_t id : {41u, 99u, 0xFFFFFFFFu}) {
        RawGguf g = RawGguf::valid();
        g.tensors[1].type = id;
        expect_broken(g, {"tensor 'b.weight'", "unsupported ggml type", "id " + std::to_string(id)});
    }
    RawGguf g = RawGguf::valid();
    g.tensors[1].type = 10;  // q2_K: known by name, not read
    g.tensors[1].ne = {256, 1};
    expect_broken(g, {"tensor 'b.weight'", "q2_K", "id 10"});
}

TEST(GgufBroken, TensorPlacement) {
    RawGguf g = RawGguf::valid();
    g.tensors[1].offset = 80;
    expect_broken(g, {"tensor 'b.weight'", "offset 80 is not a multiple of the alignment 32"});
    g = RawGguf::valid();
    g.tensors[1].offset = 32;  // [32, 168) overlaps a.weight [0, 60)
    g.data_size = 200;
    expect_broken(g, {"tensor 'b.weight'", "overlaps tensor 'a.weight'"});
    g = RawGguf::valid();
    g.tensors[0].offset = 64;  // both at 64
    g.data_size = 200;
    expect_broken(g, {"overlaps"});
    g = RawGguf::valid();
    g.data_size = 199;  // last tensor one byte short
    const std::string msg = expect_error([&] { parse(g.build()); }, {"broken.gguf: tensor 'b.weight' at offset "});
    EXPECT_NE(msg.find("past end of file"), std::string::npos);
    // The message gives the absolute byte range and the file size.
    const std::vector<uint8_t> bytes = g.build();
    const size_t data_start = bytes.size() - 199;
    EXPECT_NE(msg.find("data [" + std::to_string(data_start + 64) + ", " + std::to_string(data_start + 200) +
                       ") past end of file (" + std::to_string(bytes.size()) + " bytes)"),
              std::string::npos)
        << msg;
    g = RawGguf::valid();
    g.tensors[1].offset = ~uint64_t{0} - 31;  // aligned, and data_start + offset overflows
    g.data_size = 200;
    expect_broken(g, {"tensor 'b.weight'", "past end of file"});
    g = RawGguf::valid();
    g.tensors[1].name = "a.weight";
    expect_broken(g, {"tensor 'a.weight'", "duplicate tensor name"});
    // An empty tensor inside another's range owns no bytes; a real overlap behind it is still found.
    g = RawGguf::valid();
    g.tensors[0].ne = {64, 1};  // [0, 256)
    g.tensors.push_back({"z.empty", {0}, 0, 64, {}});
    g.tensors[1].offset = 128;
    g.data_size = 300;
    expect_broken(g, {"tensor 'b.weight'", "overlaps tensor 'a.weight'"});
}

TEST(GgufBroken, EmptyAndNull) {
    expect_error([] { File::parse(nullptr, 100, "null.gguf"); }, {"null.gguf: magic at offset 0"});
    const uint8_t four[4] = {'G', 'G', 'U', 'F'};
    expect_error([&] { File::parse(four, 4, "four.gguf"); }, {"four.gguf: version at offset 4", "truncated"});
}

}  // namespace
}  // namespace alloy::gguf
