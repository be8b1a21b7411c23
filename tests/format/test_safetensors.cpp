// safetensors: hand-written files (u64 header length + JSON + data), valid and broken.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "format/quant.h"
#include "format/safetensors.h"
#include "format_test_util.h"

namespace alloy {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

std::vector<uint8_t> make_st(const std::string& header, const std::vector<uint8_t>& data) {
    test::Bytes b;
    b.u64(header.size()).raw(header.data(), header.size()).append(test::Bytes{data});
    return b.b;
}

template <class T>
void append(std::vector<uint8_t>& out, const std::vector<T>& v) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(v.data());
    out.insert(out.end(), p, p + v.size() * sizeof(T));
}

struct Sample {
    std::vector<float> f32;      // [2, 3]
    std::vector<uint16_t> f16;   // [5]
    std::vector<uint16_t> bf16;  // [3, 1, 2]
    std::vector<uint8_t> file;
};

Sample sample(uint32_t seed) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    Sample s;
    for (int i = 0; i < 6; ++i) s.f32.push_back(u(g));
    for (int i = 0; i < 5; ++i) s.f16.push_back(fp32_to_fp16(u(g)));
    for (int i = 0; i < 6; ++i) s.bf16.push_back(fp32_to_bf16(u(g)));
    std::vector<uint8_t> data;
    append(data, s.f32);   // [0, 24)
    append(data, s.f16);   // [24, 34)
    append(data, s.bf16);  // [34, 46): odd start, so the F32/BF16 reads must tolerate misalignment
    const std::string header =
        R"({"__metadata__":{"format":"pt"},)"
        R"("w.f32":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
        R"("w.f16":{"dtype":"F16","shape":[5],"data_offsets":[24,34]},)"
        R"("w.bf16":{"dtype":"BF16","shape":[3,1,2],"data_offsets":[34,46]},)"
        R"("w.empty":{"dtype":"F32","shape":[0,4],"data_offsets":[46,46]}})";
    s.file = make_st(header, data);
    return s;
}

TEST(Safetensors, ValidFile) {
    const Sample s = sample(1);
    const std::string path = test::temp_path("ok.safetensors");
    test::write_file(path, s.file);
    auto f = SafetensorsFile::open(path);
    ASSERT_EQ(f->tensors().size(), 4u);
    EXPECT_EQ(f->tensors()[0].name, "w.bf16");  // sorted by name
    const auto* a = f->find("w.f32");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->dtype, "F32");
    EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a->nbytes, 24u);
    EXPECT_EQ(SafetensorsFile::to_f32(*a), s.f32);
    const std::vector<float> h = f->to_f32(*f->find("w.f16"));
    ASSERT_EQ(h.size(), 5u);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(h[i], fp16_to_fp32(s.f16[i]));
    const auto* bf = f->find("w.bf16");
    EXPECT_EQ(bf->shape, (std::vector<int64_t>{3, 1, 2}));
    const std::vector<float> b = f->to_f32(*bf);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(b[i], bf16_to_fp32(s.bf16[i]));
    EXPECT_EQ(f->find("w.empty")->nbytes, 0u);
    EXPECT_EQ(f->find("__metadata__"), nullptr);
    EXPECT_EQ(f->find("nope"), nullptr);
    std::remove(path.c_str());

    auto m = SafetensorsFile::parse(s.file.data(), s.file.size(), "mem");
    EXPECT_EQ(m->find("w.f32")->data, s.file.data() + s.file.size() - 46);
}

void expect_broken(const std::string& header, const std::vector<uint8_t>& data, const std::vector<std::string>& parts) {
    const std::vector<uint8_t> file = make_st(header, data);
    std::vector<std::string> all = parts;
    all.insert(all.begin(), "bad.safetensors: ");
    expect_error([&] { SafetensorsFile::parse(file.data(), file.size(), "bad.safetensors"); }, all);
}

TEST(Safetensors, BrokenFiles) {
    const std::vector<uint8_t> d24(24, 0x3F);
    // Header length past end of file.
    std::vector<uint8_t> f = make_st(R"({"a":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", d24);
    const uint64_t big = f.size();
    std::memcpy(f.data(), &big, 8);
    expect_error([&] { SafetensorsFile::parse(f.data(), f.size(), "x.st"); }, {"x.st: header length at offset 0", "past end"});
    expect_error([&] { SafetensorsFile::parse(f.data(), 5, "x.st"); }, {"x.st", "only 5 bytes"});
    expect_error([&] { SafetensorsFile::parse(nullptr, 0, "x.st"); }, {"x.st", "only 0 bytes"});

    expect_broken(R"({"a":{"dtype":"F32",)", d24, {"header at offset 8", "invalid JSON"});
    expect_broken(R"([1,2])", d24, {"not an object"});
    expect_broken(R"({"a":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]})", d24, {"nested deeper"});
    expect_broken(R"({"a":5})", d24, {"tensor 'a'", "not an object"});
    expect_broken(R"({"a":{"shape":[6],"data_offsets":[0,24]}})", d24, {"tensor 'a'", "dtype"});
    expect_broken(R"({"a":{"dtype":"I64","shape":[3],"data_offsets":[0,24]}})", d24,
                  {"tensor 'a'", "unsupported dtype 'I64'"});
    expect_broken(R"({"a":{"dtype":"F32","shape":[6],"data_offsets":[0,28]}})", d24,
                  {"tensor 'a'", "data_offsets [0, 28)", "24 bytes"});
    expect_broken(R"({"a":{"dtype":"F32","shape":[6],"data_offsets":[18446744073709551615,24]}})", d24,
                  {"tensor 'a'", "outside"});
    expect_broken(R"({"a":{"dtype":"F32","shape":[5],"data_offsets":[0,24]}})", d24,
                  {"tensor 'a'", "span 24 bytes", "needs 20"});
    expect_broken(R"({"a":{"dtype":"F32","shape":[-6],"data_offsets":[0,24]}})", d24, {"tensor 'a'", "-6"});
    expect_broken(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,24]}})", d24,
                  {"tensor 'a'", "overflows"});
    expect_broken(R"({"a":{"dtype":"F32","shape":[6],"data_offsets":[0]}})", d24, {"tensor 'a'", "data_offsets"});
    expect_broken(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                  R"("b":{"dtype":"F16","shape":[8],"data_offsets":[8,24]}})",
                  d24, {"tensor 'b'", "overlap tensor 'a'"});
}

class SafetensorsDirTest : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = test::temp_path("stdir");
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    void shard(const std::string& name, const std::string& tensor, float value) {
        std::vector<uint8_t> data;
        append(data, std::vector<float>{value, -value});
        test::write_file(dir_ + "/" + name,
                         make_st(R"({")" + tensor + R"(":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data));
    }
    std::string dir_;
};

TEST_F(SafetensorsDirTest, UnionOfShards) {
    shard("model-00001-of-00002.safetensors", "x", 1.5f);
    shard("model-00002-of-00002.safetensors", "y", 2.5f);
    auto d = SafetensorsDir::open(dir_);
    ASSERT_EQ(d->tensors().size(), 2u);
    EXPECT_EQ(d->files().size(), 2u);
    EXPECT_EQ(d->to_f32(*d->find("y")), (std::vector<float>{2.5f, -2.5f}));
    EXPECT_EQ(d->find("z"), nullptr);

    // With an index, shards come from its weight_map and every entry must be found.
    const std::string j = R"({"metadata":{},"weight_map":{"x":"model-00001-of-00002.safetensors",)"
                          R"("y":"model-00002-of-00002.safetensors"}})";
    test::write_file(dir_ + "/model.safetensors.index.json", std::vector<uint8_t>(j.begin(), j.end()));
    EXPECT_EQ(SafetensorsDir::open(dir_)->tensors().size(), 2u);
    const std::string j2 = R"({"weight_map":{"x":"model-00002-of-00002.safetensors"}})";
    test::write_file(dir_ + "/model.safetensors.index.json", std::vector<uint8_t>(j2.begin(), j2.end()));
    expect_error([&] { SafetensorsDir::open(dir_); }, {"'x'", "model-00002-of-00002.safetensors"});
    const std::string j3 = R"({"weight_map":{"x":"../evil.safetensors"}})";
    test::write_file(dir_ + "/model.safetensors.index.json", std::vector<uint8_t>(j3.begin(), j3.end()));
    expect_error([&] { SafetensorsDir::open(dir_); }, {"bad shard file"});
    fs::remove(dir_ + "/model.safetensors.index.json");

    shard("extra.safetensors", "x", 3.0f);
    expect_error([&] { SafetensorsDir::open(dir_); }, {"'x'", "also present"});
    // model.safetensors, when present, is the whole checkpoint.
    shard("model.safetensors", "only", 4.0f);
    auto one = SafetensorsDir::open(dir_);
    ASSERT_EQ(one->tensors().size(), 1u);
    EXPECT_EQ(one->tensors()[0]->name, "only");
    // A single file path works too.
    EXPECT_EQ(SafetensorsDir::open(dir_ + "/extra.safetensors")->tensors()[0]->name, "x");
}

TEST_F(SafetensorsDirTest, EmptyOrMissing) {
    expect_error([&] { SafetensorsDir::open(dir_); }, {dir_, "no .safetensors"});
    expect_error([&] { SafetensorsDir::open(dir_ + "/missing"); }, {"missing"});
}

}  // namespace
}  // namespace alloy
