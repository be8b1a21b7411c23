// Agreement with Hugging Face tokenizers on the multilingual corpus: 100% required, and every
// mismatch is printed. Vectors: scripts/make_tokenizer_vectors.py.
#include <gtest/gtest.h>

#include <chrono>

#include "tokenizer_test_util.h"

namespace alloy {
namespace {

using test::join;
using test::show;

// One vector field of every corpus case against `encode`.
template <class F>
void expect_all_cases(const char* field, F encode) {
    test::expect_all_cases(test::vectors()["cases"], field, "HF", encode);
}

TEST(HfVectors, Qwen3EncodeWithSpecialTokens) {
    expect_all_cases("ids", [](const std::string& t) { return test::qwen3().encode(t, true); });
}

TEST(HfVectors, Qwen3EncodePlainTextIgnoresAddedTokens) {
    expect_all_cases("ids_plain", [](const std::string& t) { return test::qwen3().encode(t, false); });
}

TEST(HfVectors, Qwen35PipelineOnQwen3Vocab) {
    expect_all_cases("ids_qwen35",
                     [](const std::string& t) { return test::qwen3_vocab_qwen35_pipeline().encode(t, true); });
}

template <class F>
void expect_pieces(const char* field, F split) {
    int bad = 0;
    for (const auto& c : test::vectors()["cases"]) {
        const std::string text = c["text"];
        const auto want = c[field].get<std::vector<std::string>>();
        const auto got = split(text);
        if (got != want) {
            ++bad;
            ADD_FAILURE() << field << " mismatch for " << show(text) << "\n  want: " << join(want)
                          << "\n  got:  " << join(got);
        }
    }
    EXPECT_EQ(bad, 0);
}

TEST(HfVectors, Qwen2SplitEqualsHfPreTokenizer) {
    expect_pieces("pieces_qwen2", [](const std::string& t) { return pre_tokenize(t, PreTokenizer::Qwen2); });
}

TEST(HfVectors, Qwen35SplitEqualsHfPreTokenizer) {
    expect_pieces("pieces_qwen35", [](const std::string& t) { return pre_tokenize(t, PreTokenizer::Qwen35); });
}

// spec/GGUF.md section 7 (llama.cpp's ggml-vocab-qwen35 test vectors). The Qwen3.5 vocabulary
// keeps the Qwen2 ids for these pieces, so the Qwen3 vocab with the qwen35 pipeline must
// reproduce them exactly.
TEST(HfVectors, SpecQwen35TestVectors) {
    const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
        {" ", {220}}, {"  ", {256}}, {"   ", {262}}, {"\t", {197}}, {"\n", {198}}, {"\n\n", {271}},
        {"\n\n\n", {1406}}, {"\t\n", {1572}}, {"Hello world", {9707, 1879}}, {" Hello world", {21927, 1879}},
        {" Hello World!", {21927, 4337, 0}}, {"Hello, world!", {9707, 11, 1879, 0}}, {"  Hello", {220, 21927}},
        {"    Hello\n    Hello", {262, 21927, 198, 262, 21927}}, {" (", {320}}, {"\n =", {198, 284}},
        {"' era", {6, 11385}}, {"!!!!!!", {17085, 2928}}, {"333", {18, 18, 18}},
        {"w048 7tuijk dsdfhu", {86, 15, 19, 23, 220, 22, 83, 1963, 41808, 11472, 2940, 16739}},
        {" this is \xF0\x9F\xA6\x99.cpp", {419, 374, 11162, 99, 247, 13, 10821}},
        {"\xC3\x84pfel", {86975, 15897, 301}}, {"ied 4 \xC2\xBD months", {1122, 220, 19, 220, 26062, 3951}},
        {"C\xE1\xBB\xAD" "a Vi\xE1\xBB\x87t", {34, 90063, 128324}}, {"e\xCC\x81", {68, 53839}},
        {"Hello, y'all! How are you \xF0\x9F\x98\x81 ?\xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8"
         "apple\xE5\xB7\xA5\xE4\xBD\x9C" "1314151\xE5\xA4\xA9\xEF\xBD\x9E",
         {9707, 11, 379, 64848, 0, 2585, 525, 498, 26525, 223, 937, 104100, 18493, 22377, 99257, 16, 18, 16, 19,
          16, 20, 16, 35727, 21216}},
    };
    for (const auto& [text, want] : cases)
        EXPECT_EQ(test::qwen3_vocab_qwen35_pipeline().encode(text, true), want) << show(text);
}

// Tokenizing the whole corpus must take well under a second (it takes milliseconds).
TEST(HfVectors, CorpusSpeed) {
    const auto& tok = test::qwen3();
    std::vector<std::string> texts;
    for (const auto& c : test::vectors()["cases"]) texts.push_back(c["text"]);
    size_t bytes = 0, n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& t : texts) { n += tok.encode(t, true).size(); bytes += t.size(); }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("corpus: %zu bytes -> %zu tokens in %.2f ms (%.1f MB/s)\n", bytes, n, s * 1e3, bytes / s / 1e6);
    EXPECT_LT(s, 0.25);
}

}  // namespace
}  // namespace alloy
