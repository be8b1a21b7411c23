// `alloy quantize` against its oracle, llama-quantize: the synthetic tiny and moe-tiny models
// (alloy synth, BF16, seed 42) quantized to each file type must give files whose SHA-256 equals
// that of llama-quantize's output from the same input (llama.cpp snapshot bf87261d4, no
// imatrix, 2 threads). The MoE model has 8 experts, which turns on llama-quantize's
// eight-expert rules (attn_v/attn_k to Q8_0, attn_output to Q5_K).
//
// If model/synth.cpp changes, these inputs change and so must the hashes: regenerate them by
// running llama-quantize (built by hand, never committed) on `alloy synth --preset tiny|moe-tiny
// --dtype bf16` and `sha256sum` its outputs.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "format/gguf.h"
#include "model/quantize.h"
#include "model/synth.h"

namespace alloy {
namespace {

namespace fs = std::filesystem;

std::string sha256_of_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    EXPECT_TRUE(f.good()) << p;
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
    std::vector<char> buf(1 << 20);
    while (f) {
        f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(f.gcount()));
    }
    unsigned char md[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx, md, &len);
    EVP_MD_CTX_free(ctx);
    static const char* hex = "0123456789abcdef";
    std::string s;
    for (unsigned i = 0; i < len; ++i) {
        s += hex[md[i] >> 4];
        s += hex[md[i] & 15];
    }
    return s;
}

class QuantizeVsLlama : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("alloy_quantize_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
        for (const char* preset : {"tiny", "moe-tiny"}) {
            SynthOptions so;
            so.preset = preset;
            so.dtype = GgmlType::BF16;
            so.tokenizer_json = std::string(ALLOY_SOURCE_DIR) + "/testdata/qwen3-tokenizer/tokenizer.json";
            so.out_path = (dir_ / (std::string(preset) + ".bf16.gguf")).string();
            synth_qwen35(so);
        }
    }
    static void TearDownTestSuite() { fs::remove_all(dir_); }

    static std::string quantized_hash(const std::string& preset, FileType t, int threads = 2) {
        const fs::path out = dir_ / (preset + "." + file_type_name(t) + ".gguf");
        QuantizeOptions opt;
        opt.type = t;
        opt.threads = threads;
        quantize_file((dir_ / (preset + ".bf16.gguf")).string(), out.string(), opt);
        const std::string h = sha256_of_file(out);
        fs::remove(out);
        return h;
    }
    static fs::path dir_;
};
fs::path QuantizeVsLlama::dir_;

struct Expected {
    const char* preset;
    FileType type;
    const char* sha256;  // of llama-quantize's output
};

const Expected kLlama[] = {
#include "llama_quantize_hashes.inc"
};

TEST_F(QuantizeVsLlama, FilesAreByteIdenticalToLlamaQuantize) {
    for (const Expected& e : kLlama) {
        EXPECT_EQ(quantized_hash(e.preset, e.type), e.sha256) << e.preset << " " << file_type_name(e.type);
    }
}

TEST_F(QuantizeVsLlama, ThreadCountDoesNotChangeTheBytes) {
    EXPECT_EQ(quantized_hash("tiny", FileType::Q4_K_M, 1), quantized_hash("tiny", FileType::Q4_K_M, 3));
}

TEST_F(QuantizeVsLlama, PlanFollowsTheMixes) {
    auto f = gguf::File::open((dir_ / "tiny.bf16.gguf").string());
    QuantizeOptions opt;
    opt.type = FileType::Q4_K_M;
    int n_q6 = 0, n_q4 = 0, n_f32 = 0;
    for (const TensorQuantPlan& p : plan_quantization(*f, opt)) {
        if (p.name == "token_embd.weight") EXPECT_EQ(p.to, GgmlType::Q6_K) << "tied embedding takes the output's type";
        if (p.name.find("_norm.weight") != std::string::npos || p.name.find("ssm_conv1d") != std::string::npos) {
            EXPECT_EQ(p.to, p.from) << p.name;
        }
        n_q6 += p.to == GgmlType::Q6_K;
        n_q4 += p.to == GgmlType::Q4_K;
        n_f32 += p.to == GgmlType::F32;
    }
    EXPECT_GT(n_q6, 1);
    EXPECT_GT(n_q4, n_q6);
    EXPECT_GT(n_f32, 0);
    opt.pure = true;
    for (const TensorQuantPlan& p : plan_quantization(*f, opt)) {
        if (p.from == GgmlType::BF16 && p.name != "token_embd.weight") EXPECT_EQ(p.to, GgmlType::Q4_K) << p.name;
    }
}

TEST_F(QuantizeVsLlama, BadRequestsNameWhatIsWrong) {
    const std::string in = (dir_ / "tiny.bf16.gguf").string();
    const std::string q8 = (dir_ / "tiny.q8.gguf").string();
    QuantizeOptions opt;
    opt.type = FileType::Q8_0;
    quantize_file(in, q8, opt);
    opt.type = FileType::Q4_K_M;
    try {
        quantize_file(q8, (dir_ / "x.gguf").string(), opt);
        ADD_FAILURE() << "requantizing without --allow-requantize must fail";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--allow-requantize"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir_ / "x.gguf")) << "no half-written output";
    EXPECT_FALSE(fs::exists(dir_ / "x.gguf.tmp"));
    try {
        parse_file_type("Q3_K_XL");
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("Q3_K_XL"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("Q4_K_M"), std::string::npos) << "lists the valid names";
    }
    EXPECT_EQ(parse_file_type("q4_k_m"), FileType::Q4_K_M);
    fs::remove(q8);
}

}  // namespace
}  // namespace alloy
