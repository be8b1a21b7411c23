// Shared fixtures for the tokenizer tests: the real Qwen3 tokenizer (loaded once) and the
// HF-generated vectors (scripts/make_tokenizer_vectors.py).
#pragma once
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "tokenizer/tokenizer.h"

namespace alloy::test {

inline std::string source_path(const std::string& rel) { return std::string(ALLOY_SOURCE_DIR) + "/" + rel; }

// The real Qwen3 vocabulary, committed under testdata/ (Apache-2.0, see its README).
inline std::string qwen3_tokenizer_json() { return source_path("testdata/qwen3-tokenizer/tokenizer.json"); }

inline const Tokenizer& qwen3() {
    static const Tokenizer tok = Tokenizer::from_hf_json(qwen3_tokenizer_json());
    return tok;
}

// The Qwen3.5 pipeline on the Qwen3 vocabulary: Qwen3.5 split regex and no NFC.
inline const Tokenizer& qwen3_vocab_qwen35_pipeline() {
    static const Tokenizer tok = [] {
        Vocab v = qwen3().vocab();
        v.pre = PreTokenizer::Qwen35;
        v.nfc = false;
        return Tokenizer(std::move(v));
    }();
    return tok;
}

inline const nlohmann::json& vectors() {
    static const nlohmann::json j = [] {
        std::ifstream in(source_path("tests/tokenizer/data/qwen3_vectors.json"), std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        return nlohmann::json::parse(ss.str());
    }();
    return j;
}

// Escapes control characters and non-ASCII so mismatch reports stay readable.
inline std::string show(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || c == 0x7f) { char buf[8]; snprintf(buf, sizeof buf, "\\x%02x", c); out += buf; }
        else out += static_cast<char>(c);
    }
    return out + "\"";
}

template <class V>
std::string join(const V& v) {
    std::string out;
    for (const auto& x : v) {
        if (!out.empty()) out += ' ';
        if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::string>) out += show(x);
        else out += std::to_string(x);
    }
    return out;
}

// Compares one id field of every case of a vectors file against `encode` (100% required;
// every mismatch is reported). `oracle` names the reference in the summary.
template <class F>
void expect_all_cases(const nlohmann::json& cases, const char* field, const char* oracle, F encode) {
    ASSERT_GE(cases.size(), 150u);
    int bad = 0;
    for (const auto& c : cases) {
        const std::string text = c["text"];
        const auto want = c[field].get<std::vector<int32_t>>();
        const auto got = encode(text);
        if (got != want) {
            ++bad;
            ADD_FAILURE() << field << " mismatch for " << show(text) << "\n  want: " << join(want)
                          << "\n  got:  " << join(got);
        }
    }
    EXPECT_EQ(bad, 0) << bad << " of " << cases.size() << " cases differ from " << oracle << " (" << field << ")";
}

}  // namespace alloy::test
