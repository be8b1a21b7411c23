// Writer -> file -> reader round trips for every metadata type and every tensor type, and
// the typed getters' conversions and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "format/gguf.h"
#include "format/quant.h"
#include "format_test_util.h"

namespace alloy::gguf {
namespace {

using test::expect_error;

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(g);
    return v;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 g(seed);
    std::vector<uint8_t> v(n);
    for (uint8_t& x : v) x = static_cast<uint8_t>(g());
    return v;
}

// Every scalar type, and an array of each element type, with values near the type limits.
Writer all_metadata_writer() {
    Writer w;
    w.set("t.u8", Value::integer(ValueType::UINT8, 201));
    w.set("t.i8", Value::integer(ValueType::INT8, -113));
    w.set("t.u16", Value::integer(ValueType::UINT16, 60013));
    w.set("t.i16", Value::integer(ValueType::INT16, -30011));
    w.set("t.u32", Value::u32(4000000007u));
    w.set("t.i32", Value::i32(-2000000011));
    w.set("t.f32", Value::f32(1.25e-3f));
    w.set("t.bool", Value::boolean(true));
    w.set("t.str", Value::str("h\xC3\xA9llo \n wor\0ld"));
    w.set("t.u64", Value::u64((uint64_t{1} << 63) + 17));
    w.set("t.i64", Value::i64(-(int64_t{1} << 41) - 3));
    w.set("t.f64", Value::f64(3.14159265358979311600));
    w.set("t.arr.u8", Value::int_array(ValueType::UINT8, {0, 255, 7}));
    w.set("t.arr.i8", Value::int_array(ValueType::INT8, {-128, 127, -5}));
    w.set("t.arr.u16", Value::int_array(ValueType::UINT16, {65535, 3}));
    w.set("t.arr.i16", Value::int_array(ValueType::INT16, {-32768, 32767, 9}));
    w.set("t.arr.u32", Value::int_array(ValueType::UINT32, {4294967295, 1}));
    w.set("t.arr.i32", Value::i32_array({11, -10, 11, 0x7FFFFFFF}));
    w.set("t.arr.f32", Value::f32_array({1.5f, -2.25f, 1e-30f}));
    w.set("t.arr.bool", Value::int_array(ValueType::BOOL, {1, 0, 1, 1}));
    w.set("t.arr.str", Value::str_array({"a", "", "left right", std::string(300, 'z')}));
    w.set("t.arr.u64", Value::int_array(ValueType::UINT64, {5, static_cast<int64_t>(0xFFFFFFFFFFFFFFFFull)}));
    w.set("t.arr.i64", Value::int_array(ValueType::INT64, {INT64_MIN, INT64_MAX, -1}));
    w.set("t.arr.f64", Value::f64_array({-1e300, 2.5}));
    w.set("t.arr.empty", Value::i32_array({}));
    return w;
}

TEST(GgufRoundTrip, EveryMetadataType) {
    const std::string path = test::temp_path("meta.gguf");
    all_metadata_writer().write(path);
    auto f = File::open(path);
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->alignment(), 32u);
    EXPECT_EQ(f->metadata().size(), 25u);
    EXPECT_EQ(f->metadata()[0].first, "t.u8");  // insertion order kept
    EXPECT_EQ(f->find("t.u8")->u, 201u);
    EXPECT_EQ(f->find("t.u8")->type, ValueType::UINT8);
    EXPECT_EQ(f->find("t.i8")->i, -113);
    EXPECT_EQ(f->find("t.u16")->u, 60013u);
    EXPECT_EQ(f->find("t.i16")->i, -30011);
    EXPECT_EQ(f->find("t.u32")->u, 4000000007u);
    EXPECT_EQ(f->find("t.i32")->i, -2000000011);
    EXPECT_EQ(f->find("t.f32")->f, 1.25e-3f);
    EXPECT_EQ(f->find("t.bool")->i, 1);
    EXPECT_EQ(f->find("t.str")->s, "h\xC3\xA9llo \n wor");  // the literal stops at \0
    EXPECT_EQ(f->find("t.u64")->u, (uint64_t{1} << 63) + 17);
    EXPECT_EQ(f->find("t.i64")->i, -(int64_t{1} << 41) - 3);
    EXPECT_EQ(f->find("t.f64")->f, 3.14159265358979311600);
    EXPECT_EQ(f->find("t.arr.u8")->ints, (std::vector<int64_t>{0, 255, 7}));
    EXPECT_EQ(f->find("t.arr.i8")->ints, (std::vector<int64_t>{-128, 127, -5}));
    EXPECT_EQ(f->find("t.arr.u16")->ints, (std::vector<int64_t>{65535, 3}));
    EXPECT_EQ(f->find("t.arr.i16")->ints, (std::vector<int64_t>{-32768, 32767, 9}));
    EXPECT_EQ(f->find("t.arr.u32")->ints, (std::vector<int64_t>{4294967295, 1}));
    EXPECT_EQ(f->get_int_array("t.arr.i32"), (std::vector<int64_t>{11, -10, 11, 0x7FFFFFFF}));
    EXPECT_EQ(f->get_float_array("t.arr.f32"), (std::vector<float>{1.5f, -2.25f, 1e-30f}));
    EXPECT_EQ(f->find("t.arr.bool")->ints, (std::vector<int64_t>{1, 0, 1, 1}));
    EXPECT_EQ(f->get_string_array("t.arr.str"),
              (std::vector<std::string>{"a", "", "left right", std::string(300, 'z')}));
    EXPECT_EQ(static_cast<uint64_t>(f->find("t.arr.u64")->ints[1]), 0xFFFFFFFFFFFFFFFFull);
    EXPECT_EQ(f->find("t.arr.i64")->ints, (std::vector<int64_t>{INT64_MIN, INT64_MAX, -1}));
    EXPECT_EQ(f->find("t.arr.f64")->floats, (std::vector<double>{-1e300, 2.5}));
    EXPECT_EQ(f->find("t.arr.empty")->array_size(), 0u);
    EXPECT_EQ(f->find("t.arr.str")->array_size(), 4u);
    EXPECT_EQ(f->find("t.arr.str")->elem_type, ValueType::STRING);
    std::remove(path.c_str());
}

TEST(GgufRoundTrip, EveryTensorType) {
    const std::string path = test::temp_path("tensors.gguf");
    Writer w;
    w.set("general.architecture", Value::str("test"));
    // Odd shapes; quantized rows are whole blocks.
    const std::vector<float> a = random_floats(7 * 5 * 3, 1);
    const std::vector<float> b = random_floats(13 * 3, 2);
    const std::vector<float> c = random_floats(9 * 1 * 2 * 3, 3);
    const std::vector<float> q8 = random_floats(96 * 3, 4);
    const std::vector<float> q4 = random_floats(64 * 5, 5);
    const std::vector<uint8_t> q4k = random_bytes(144 * 2 * 3, 6);  // {512, 3}
    const std::vector<uint8_t> q6k = random_bytes(210 * 1 * 5, 7);  // {256, 5}
    w.add_tensor_f32("a.f32", GgmlType::F32, {7, 5, 3}, a.data());
    w.add_tensor_f32("b.f16", GgmlType::F16, {13, 3}, b.data());
    w.add_tensor_f32("c.bf16", GgmlType::BF16, {9, 1, 2, 3}, c.data());
    w.add_tensor_f32("d.q8_0", GgmlType::Q8_0, {96, 3}, q8.data());
    w.add_tensor_f32("e.q4_0", GgmlType::Q4_0, {64, 5}, q4.data());
    w.add_tensor("f.q4_k", GgmlType::Q4_K, {512, 3}, q4k);
    w.add_tensor("g.q6_k", GgmlType::Q6_K, {256, 5}, q6k);
    w.add_tensor("h.empty", GgmlType::F32, {0}, {});
    w.write(path);

    auto f = File::open(path);
    ASSERT_EQ(f->tensors().size(), 8u);
    auto deq = [](const TensorInfo& t) {
        std::vector<float> out(static_cast<size_t>(t.n_elements()));
        const size_t rb = row_bytes(t.type, t.ne[0]);
        for (int64_t r = 0; r < t.n_elements() / t.ne[0]; ++r) {
            dequantize_row(t.type, t.data + r * rb, out.data() + r * t.ne[0], t.ne[0]);
        }
        return out;
    };
    const TensorInfo& ta = f->tensor("a.f32");
    EXPECT_EQ(ta.ne, (std::vector<int64_t>{7, 5, 3}));
    EXPECT_EQ(ta.type, GgmlType::F32);
    EXPECT_EQ(ta.nbytes, a.size() * 4);
    EXPECT_EQ(deq(ta), a);
    const TensorInfo& tb = f->tensor("b.f16");
    std::vector<float> got = deq(tb);
    for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(got[i], fp16_to_fp32(fp32_to_fp16(b[i])));
    const TensorInfo& tc = f->tensor("c.bf16");
    EXPECT_EQ(tc.ne, (std::vector<int64_t>{9, 1, 2, 3}));
    got = deq(tc);
    for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(got[i], bf16_to_fp32(fp32_to_bf16(c[i])));
    for (const auto& [name, src] : {std::pair<const char*, const std::vector<float>*>{"d.q8_0", &q8},
                                    std::pair<const char*, const std::vector<float>*>{"e.q4_0", &q4}}) {
        const TensorInfo& t = f->tensor(name);
        std::vector<uint8_t> want(t.nbytes);
        for (int64_t r = 0; r < t.ne[1]; ++r) {
            quantize_row(t.type, src->data() + r * t.ne[0], want.data() + r * row_bytes(t.type, t.ne[0]), t.ne[0]);
        }
        EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.nbytes), want) << name;
        got = deq(t);
        for (size_t i = 0; i < src->size(); ++i) EXPECT_NEAR(got[i], (*src)[i], 0.3f) << name;
    }
    EXPECT_EQ(std::vector<uint8_t>(f->tensor("f.q4_k").data, f->tensor("f.q4_k").data + 144 * 6), q4k);
    EXPECT_EQ(std::vector<uint8_t>(f->tensor("g.q6_k").data, f->tensor("g.q6_k").data + 210 * 5), q6k);
    EXPECT_EQ(f->tensor("h.empty").nbytes, 0u);
    const uint8_t* base = f->tensors()[0].data - f->tensors()[0].offset;
    for (const TensorInfo& t : f->tensors()) {
        EXPECT_EQ(t.offset % 32, 0u) << t.name;
        EXPECT_EQ((t.data - base) % 32, 0) << t.name;  // data_start is aligned too
    }
    std::remove(path.c_str());
}

TEST(GgufRoundTrip, ParseFromMemoryMatchesOpen) {
    const std::string path = test::temp_path("mem.gguf");
    Writer w;
    const std::vector<float> v = random_floats(64, 9);
    w.set("k", Value::u32(3));
    w.add_tensor_f32("x", GgmlType::Q8_0, {64}, v.data());
    w.write(path);
    const std::vector<uint8_t> bytes = test::read_file(path);
    auto f = File::parse(bytes.data(), bytes.size(), "mem");
    EXPECT_EQ(f->path(), "mem");
    EXPECT_EQ(f->get_u32("k"), 3u);
    // The file ends with the two Q8_0 blocks (68 bytes) padded to 96.
    EXPECT_EQ(f->tensor("x").data, bytes.data() + bytes.size() - 96);
    std::vector<float> back(64);
    dequantize_row(GgmlType::Q8_0, f->tensor("x").data, back.data(), 64);
    for (int i = 0; i < 64; ++i) EXPECT_NEAR(back[i], v[i], 0.01f);
    std::remove(path.c_str());
}

// TensorData::Resident reads the tensor bytes into memory of its own: same metadata, same
// bytes, pointers into one 2 MiB-aligned copy instead of the mapping (spacing kept), and the
// bytes stay valid for the File's lifetime. Alignment 64 and an odd tensor make the span start
// past the header and end unaligned.
TEST(GgufOpen, ResidentCopyHasTheMappedBytes) {
    const std::string path = test::temp_path("resident.gguf");
    Writer w(64);
    w.set("general.architecture", Value::str("test"));
    const std::vector<float> a = random_floats(3 * 1000 + 1, 21);
    const std::vector<float> q = random_floats(32 * 777, 22);
    w.add_tensor_f32("a", GgmlType::F32, {3001}, a.data());
    w.add_tensor_f32("q", GgmlType::Q8_0, {32 * 7, 111}, q.data());
    w.add_tensor("e", GgmlType::F32, {0}, {});
    w.write(path);
    auto mapped = File::open(path);
    auto resident = File::open(path, TensorData::Resident);
    EXPECT_EQ(resident->get_string("general.architecture"), "test");
    ASSERT_EQ(resident->tensors().size(), mapped->tensors().size());
    const uint8_t* r0 = resident->tensors()[0].data;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r0) % (uintptr_t(2) << 20), 0u);
    for (size_t i = 0; i < mapped->tensors().size(); ++i) {
        const TensorInfo& m = mapped->tensors()[i];
        const TensorInfo& r = resident->tensors()[i];
        EXPECT_NE(r.data, m.data) << m.name;
        EXPECT_EQ(r.data - r0, m.data - mapped->tensors()[0].data) << m.name;
        EXPECT_EQ(r.nbytes, m.nbytes) << m.name;
        EXPECT_EQ(0, std::memcmp(r.data, m.data, m.nbytes)) << m.name;
    }
    EXPECT_TRUE(resident->resident());
    EXPECT_FALSE(mapped->resident());
    // Tensor bytes above 90% of the memory limit stay mapped (a model larger than memory).
    auto too_big = File::open(path, TensorData::Resident, /*memory_limit=*/4096);
    EXPECT_FALSE(too_big->resident());
    EXPECT_EQ(too_big->tensor("q").nbytes, mapped->tensor("q").nbytes);
    EXPECT_EQ(0, std::memcmp(too_big->tensor("q").data, mapped->tensor("q").data, mapped->tensor("q").nbytes));
    std::remove(path.c_str());  // the copy does not depend on the file any more
    std::vector<float> back(3001);
    dequantize_row(GgmlType::F32, resident->tensor("a").data, back.data(), 3001);
    EXPECT_EQ(back, a);
}

TEST(ResidentBytes, ReadsRangesAndNamesWhatFailed) {
    const std::string path = test::temp_path("range.bin");
    const std::vector<uint8_t> bytes = random_bytes(100000, 23);
    test::write_file(path, bytes);
    ResidentBytes r = ResidentBytes::read(path, 777, 90000);
    ASSERT_EQ(r.size(), 90000u);
    EXPECT_EQ(0, std::memcmp(r.data(), bytes.data() + 777, 90000));
    ResidentBytes moved = std::move(r);
    EXPECT_EQ(r.data(), nullptr);
    EXPECT_EQ(0, std::memcmp(moved.data(), bytes.data() + 777, 90000));
    expect_error([&] { ResidentBytes::read(path, 99000, 2000); }, {path, "byte 100000", "end of file"});
    expect_error([] { ResidentBytes::read("/nonexistent/x.bin", 0, 10); }, {"/nonexistent/x.bin", "cannot open"});
    std::remove(path.c_str());
    // Over 2 MiB: read in 2 MiB-aligned shares by several threads (when the machine has them);
    // a file that ends inside a later share still names the byte where it ended.
    const size_t big = (size_t(5) << 20) + 333;
    const std::vector<uint8_t> large = random_bytes(big, 24);
    test::write_file(path, large);
    ResidentBytes l = ResidentBytes::read(path, 100, big - 100);
    ASSERT_EQ(l.size(), big - 100);
    EXPECT_EQ(0, std::memcmp(l.data(), large.data() + 100, big - 100));
    expect_error([&] { ResidentBytes::read(path, 0, big + 1000); }, {path, "byte " + std::to_string(big), "end of file"});
    std::remove(path.c_str());
}

TEST(GgufWriter, NonDefaultAlignment) {
    const std::string path = test::temp_path("align.gguf");
    Writer w(64);
    const std::vector<float> v = random_floats(3 * 5, 10);
    w.add_tensor_f32("p", GgmlType::F32, {3}, v.data());
    w.add_tensor_f32("q", GgmlType::F32, {5, 3}, v.data());
    w.write(path);
    auto f = File::open(path);
    EXPECT_EQ(f->alignment(), 64u);
    EXPECT_EQ(f->get_u32("general.alignment"), 64u);
    EXPECT_EQ(f->tensor("q").offset, 64u);
    const std::vector<uint8_t> bytes = test::read_file(path);
    auto g = File::parse(bytes.data(), bytes.size(), "mem");
    EXPECT_EQ((g->tensor("p").data - bytes.data()) % 64, 0);
    EXPECT_EQ((g->tensor("q").data - bytes.data()) % 64, 0);
    std::remove(path.c_str());

    Writer bad(48);
    expect_error([&] { bad.write(path); }, {path, "48", "power of two"});
    Writer clash(64);
    clash.set("general.alignment", Value::u32(32));
    expect_error([&] { clash.write(path); }, {"general.alignment"});
}

TEST(GgufWriter, SetReplacesAndChecksSizes) {
    Writer w;
    w.set("a", Value::u32(1));
    w.set("b", Value::str("x"));
    w.set("a", Value::str("two"));
    const std::string path = test::temp_path("set.gguf");
    expect_error([&] { w.add_tensor("t", GgmlType::Q8_0, {64, 2}, std::vector<uint8_t>(67)); },
                 {"'t'", "67", "136"});
    expect_error([&] { w.add_tensor("t", GgmlType::Q8_0, {40}, std::vector<uint8_t>(34)); }, {"'t'", "block size"});
    expect_error([&] { w.add_tensor("t", GgmlType::F32, {}, {}); }, {"'t'", "dims"});
    expect_error([&] { w.add_tensor("t", GgmlType::F32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)); }, {"'t'"});
    expect_error([&] { w.add_tensor("t", static_cast<GgmlType>(10), {256}, std::vector<uint8_t>(84)); }, {"q2_K"});
    w.add_tensor("t", GgmlType::F16, {3}, std::vector<uint8_t>{1, 2, 3, 4, 5, 6});
    expect_error([&] { w.add_tensor("t", GgmlType::F16, {3}, std::vector<uint8_t>(6)); }, {"duplicate", "'t'"});
    const std::vector<float> v = random_floats(256, 11);
    expect_error([&] { w.add_tensor_f32("k", static_cast<GgmlType>(10), {256}, v.data()); }, {"q2_K"});
    w.add_tensor_f32("k", GgmlType::Q6_K, {256}, v.data());  // every type we read is written too
    w.write(path);
    auto f = File::open(path);
    ASSERT_EQ(f->metadata().size(), 2u);
    EXPECT_EQ(f->metadata()[0].first, "a");
    EXPECT_EQ(f->get_string("a"), "two");
    EXPECT_EQ(std::vector<uint8_t>(f->tensor("t").data, f->tensor("t").data + 6),
              (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
    std::remove(path.c_str());

    Writer nested;
    Value v2 = Value::i32_array({1});
    v2.elem_type = ValueType::ARRAY;
    nested.set("n", v2);
    expect_error([&] { nested.write(path); }, {"'n'", "nested"});
    Writer range;
    range.set("r", Value::integer(ValueType::UINT8, 256));
    expect_error([&] { range.write(path); }, {"'r'", "256", "uint8"});
}

TEST(GgufGetters, ConversionsAndErrors) {
    Writer w;
    w.set("i32.pos", Value::i32(12345));
    w.set("i32.neg", Value::i32(-7));
    w.set("u8", Value::integer(ValueType::UINT8, 250));
    w.set("u64.big", Value::u64(uint64_t{1} << 33));
    w.set("i64.ok", Value::i64(4000000000));
    w.set("f32", Value::f32(0.5f));
    w.set("f64", Value::f64(1e-6));
    w.set("b", Value::boolean(false));
    w.set("s", Value::str("qwen35"));
    w.set("arr.u8", Value::int_array(ValueType::UINT8, {3, 200}));
    w.set("arr.f64", Value::f64_array({0.25, -8}));
    w.set("arr.s", Value::str_array({"x"}));
    const std::string path = test::temp_path("get.gguf");
    w.write(path);
    auto f = File::open(path);

    EXPECT_EQ(f->get_u32("i32.pos"), 12345u);
    EXPECT_EQ(f->get_u32("u8"), 250u);
    EXPECT_EQ(f->get_u32("i64.ok"), 4000000000u);
    EXPECT_EQ(f->get_u32_or("absent", 77), 77u);
    EXPECT_EQ(f->find("i32.pos")->u, 12345u);  // both integer fields filled when they fit
    EXPECT_EQ(f->find("u8")->i, 250);
    expect_error([&] { f->get_u32("i32.neg"); }, {path, "'i32.neg'", "-7", "uint32"});
    expect_error([&] { f->get_u32("u64.big"); }, {path, "'u64.big'", "8589934592"});
    expect_error([&] { f->get_u32("s"); }, {path, "'s'", "expected uint32", "got string"});
    expect_error([&] { f->get_u32("nope"); }, {path, "'nope'", "missing"});
    expect_error([&] { f->get_u32_or("f32", 1); }, {"'f32'", "expected uint32", "float32"});

    EXPECT_EQ(f->get_f32("f32"), 0.5f);
    EXPECT_EQ(f->get_f32("f64"), 1e-6f);
    EXPECT_EQ(f->get_f32_or("absent", 2.5f), 2.5f);
    expect_error([&] { f->get_f32("u8"); }, {"'u8'", "expected float32", "got uint8"});
    expect_error([&] { f->get_f32("nope"); }, {path, "'nope'"});

    EXPECT_FALSE(f->get_bool_or("b", true));
    EXPECT_TRUE(f->get_bool_or("absent", true));
    expect_error([&] { f->get_bool_or("s", true); }, {"'s'", "expected bool", "string"});

    EXPECT_EQ(f->get_string("s"), "qwen35");
    EXPECT_EQ(f->get_string_or("absent", "d"), "d");
    expect_error([&] { f->get_string("u8"); }, {"'u8'", "expected string", "uint8"});
    expect_error([&] { f->get_string_or("b", "d"); }, {"'b'", "expected string", "bool"});

    EXPECT_EQ(f->get_int_array("arr.u8"), (std::vector<int64_t>{3, 200}));
    EXPECT_EQ(f->get_float_array("arr.f64"), (std::vector<float>{0.25f, -8.0f}));
    EXPECT_EQ(f->get_string_array("arr.s"), std::vector<std::string>{"x"});
    expect_error([&] { f->get_int_array("arr.s"); }, {"'arr.s'", "array of string"});
    expect_error([&] { f->get_float_array("arr.u8"); }, {"'arr.u8'", "array of uint8"});
    expect_error([&] { f->get_string_array("s"); }, {"'s'", "expected array of string", "got string"});
    expect_error([&] { f->get_string_array("nope"); }, {path, "'nope'"});
    expect_error([&] { f->tensor("blk.0.missing"); }, {path, "'blk.0.missing'"});
    EXPECT_EQ(f->find_tensor("blk.0.missing"), nullptr);
    EXPECT_FALSE(f->has("nope"));
    EXPECT_TRUE(f->has("s"));
    std::remove(path.c_str());
}

TEST(GgufOpen, MissingAndNonRegularFiles) {
    expect_error([] { File::open("/nonexistent/dir/x.gguf"); }, {"/nonexistent/dir/x.gguf", "cannot open"});
    expect_error([] { File::open(::testing::TempDir()); }, {"not a regular file"});
    const std::string path = test::temp_path("empty.gguf");
    test::write_file(path, {});
    expect_error([&] { File::open(path); }, {path, "magic", "truncated"});
    std::remove(path.c_str());
}

}  // namespace
}  // namespace alloy::gguf
