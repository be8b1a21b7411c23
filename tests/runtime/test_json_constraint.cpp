// The JSON prefix automaton and the vocabulary mask of runtime/json_constraint.h: every prefix
// of a valid document is accepted and only the whole document is complete; the first bad
// byte of an invalid one is refused at exactly its place; min_to_complete is the length of a
// shortest completion (checked by a breadth-first search); the trie's mask equals a token by
// token simulation over the real Qwen3 vocabulary, and costs what the report says per step.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "runtime/json_constraint.h"
#include "tokenizer/tokenizer.h"

namespace alloy {
namespace {

// The byte at which `text` stops being a JSON prefix, or -1 when every byte is accepted.
long first_refused(const std::string& text, bool object_only = true) {
    JsonPrefix p(object_only);
    for (size_t i = 0; i < text.size(); ++i)
        if (!p.push(static_cast<unsigned char>(text[i]))) return long(i);
    return -1;
}

bool completes(const std::string& text, bool object_only = true) {
    JsonPrefix p(object_only);
    return p.push(text) && p.complete();
}

const std::vector<std::string> kValid = {
    "{}",
    "{\"a\":1}",
    "{\n  \"a\": [1, 2.5, -0.25e+3, 0, 1E5, true, false, null],\n  \"b\": {\"c\": \"d\"}\n}",
    R"({"esc":"\"\\\/\b\f\n\r\t\u00e9\u20AC\uFFFF"})",
    "{\"utf8\":\"\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xED\x9F\xBF \xF4\x8F\xBF\xBF\"}",
    R"({"":[],"x":[[]],"y":[{}],"z":[[[[1]]]]})",
    R"({"n":-0,"m":0.0,"k":123456789,"e":1e-7,"E":-2E+10})",
    R"({"a":{"b":{"c":{"d":[{"e":"f"}]}}}})",
};

TEST(JsonPrefix, EveryPrefixOfAValidDocumentIsAcceptedAndOnlyTheWholeIsComplete) {
    for (const std::string& doc : kValid) {
        ASSERT_TRUE(nlohmann::json::parse(doc).is_object()) << doc;  // the test's own documents are JSON objects
        JsonPrefix p;
        for (size_t i = 0; i < doc.size(); ++i) {
            EXPECT_FALSE(p.complete()) << doc << " at " << i;
            EXPECT_GT(p.min_to_complete(), 0) << doc << " at " << i;
            ASSERT_TRUE(p.push(static_cast<unsigned char>(doc[i]))) << doc << " refused at byte " << i;
        }
        EXPECT_TRUE(p.complete()) << doc;
        EXPECT_EQ(p.min_to_complete(), 0) << doc;
        JsonPrefix q = p;
        EXPECT_FALSE(q.push(' ')) << "nothing may follow the object: " << doc;
    }
}

TEST(JsonPrefix, RefusesTheFirstBadByteAtItsPlace) {
    struct Case {
        std::string text;
        long at;
    };
    const std::vector<Case> cases = {
        {"[1]", 0},                  // object_only: the top level is an object
        {"\"x\"", 0},
        {"x", 0},
        {"{a", 1},                   // keys are strings
        {"{\"a\" 1", 5},             // ':' missing
        {"{\"a\":}", 5},             // value missing
        {"{\"a\":1,}", 7},           // trailing comma
        {"{\"a\":1]", 6},            // mismatched closer
        {"{\"a\":[1}", 7},
        {"{\"a\":[1,]", 8},
        {"{\"a\":tru ", 8},
        {"{\"a\":nul}", 8},
        {"{\"a\":01", 6},            // no leading zeros
        {"{\"a\":-}", 6},
        {"{\"a\":1.}", 7},
        {"{\"a\":1.e5}", 7},
        {"{\"a\":1e}", 7},
        {"{\"a\":1e+}", 8},
        {"{\"a\":+1}", 5},
        {"{\"a\":.5}", 5},
        {"{\"a\":\"\\x\"}", 7},      // unknown escape
        {"{\"a\":\"\\u12g4\"}", 10},
        {"{\"a\":\"\\uD83D\\uDE00\"}", 9},  // surrogate escapes refused (UTF-8 instead)
        {"{\"a\":\"\\udc00\"}", 9},
        {std::string("{\"a\":\"\x01\"}"), 6},  // raw control character
        {"{\"a\":\"\xC0\x80\"}", 6},   // overlong
        {"{\"a\":\"\xE0\x80\x80\"}", 7},
        {"{\"a\":\"\xED\xA0\x80\"}", 7},  // UTF-8 surrogate
        {"{\"a\":\"\xF4\x90\x80\x80\"}", 7},  // past U+10FFFF
        {"{\"a\":\"\xC3\"}", 7},       // truncated sequence
        {"{\"a\":\"\x80\"}", 6},       // lone continuation byte
        {"{\"a\":1}}", 7},           // after the end
        {"{\"a\":1} ", 7},
    };
    for (const Case& c : cases) EXPECT_EQ(first_refused(c.text), c.at) << c.text;
}

TEST(JsonPrefix, NumbersAndLiteralsEndWhereTheGrammarSays) {
    for (const char* n : {"0", "-0", "12", "-12.5", "0.5e10", "1E-3", "7e+0"}) {
        EXPECT_TRUE(completes(n, false)) << n;
        EXPECT_TRUE(completes(std::string("{\"n\":") + n + "}")) << n;
    }
    for (const char* n : {"-", "1.", "1e", "1e-", "tru", "nul"}) EXPECT_FALSE(completes(n, false)) << n;
    EXPECT_EQ(first_refused("00", false), 1);
    EXPECT_EQ(first_refused("1 ", false), 1);  // a top-level number ends the text
    EXPECT_TRUE(completes("[true,false,null]", false));
    EXPECT_TRUE(completes("\"s\"", false));
}

TEST(JsonPrefix, NestingAndWhitespaceAreBounded) {
    std::string deep = "{\"a\":";
    for (int i = 1; i < JsonPrefix::kMaxDepth; ++i) deep += "[";
    EXPECT_EQ(first_refused(deep), -1);
    EXPECT_EQ(first_refused(deep + "["), long(deep.size()));  // depth 33
    std::string closed = deep + "1";
    for (int i = 1; i < JsonPrefix::kMaxDepth; ++i) closed += "]";
    EXPECT_TRUE(completes(closed + "}"));
    const std::string ws(JsonPrefix::kMaxWhitespace, ' ');
    EXPECT_TRUE(completes("{" + ws + "\"a\"" + ws + ":" + ws + "1" + ws + "}"));
    EXPECT_EQ(first_refused("{" + ws + " "), long(1 + ws.size()));
    EXPECT_EQ(first_refused(" {}"), 0);  // the text starts with its value
    EXPECT_EQ(first_refused(" 1", false), 0);
    // Whitespace inside strings is text, not limited.
    EXPECT_TRUE(completes("{\"a\":\"" + std::string(100, ' ') + "\"}"));
}

// A shortest completion by breadth-first search over the bytes any completion can need.
int bfs_completion(const JsonPrefix& start) {
    const std::string alphabet = "{\"0:}],.-+eEtrufalsn\\\x80\x90\xA0";
    std::queue<std::pair<JsonPrefix, int>> q;
    std::unordered_set<JsonPrefix, JsonPrefixHash> seen{start};
    q.push({start, 0});
    while (!q.empty()) {
        auto [s, d] = q.front();
        q.pop();
        if (s.complete()) return d;
        for (char c : alphabet) {
            JsonPrefix n = s;
            if (n.push(static_cast<unsigned char>(c)) && seen.insert(n).second) q.push({n, d + 1});
        }
    }
    return -1;
}

TEST(JsonPrefix, MinToCompleteIsAShortestCompletion) {
    for (const std::string& doc : kValid)
        for (size_t i = 0; i < doc.size(); ++i) {
            JsonPrefix p;
            ASSERT_TRUE(p.push(std::string_view(doc).substr(0, i)));
            EXPECT_EQ(p.min_to_complete(), bfs_completion(p)) << doc.substr(0, i);
        }
    JsonPrefix p;
    ASSERT_TRUE(p.push("{\"a\":\"\\u0"));
    EXPECT_EQ(p.min_to_complete(), 3 + 1 + 1);  // three hex digits, the quote, the brace
}

// The Qwen3 vocabulary of testdata/ (what the default model uses).
const Tokenizer& qwen3() {
    static const Tokenizer t = Tokenizer::from_hf_json(std::string(ALLOY_SOURCE_DIR) + "/testdata/qwen3-tokenizer/tokenizer.json");
    return t;
}

TEST(JsonTokenMask, EqualsATokenByTokenSimulationOverTheRealVocabulary) {
    const Tokenizer& tok = qwen3();
    const int V = tok.n_vocab() + 7;  // padded rows past the tokenizer are refused
    JsonTokenMask mask(tok, V);
    const std::vector<std::string> prefixes = {"", "{", "{\"ke", "{\"a\":\"x", "{\"a\":[\"x", "{\"a\":", "{\"a\": [1, 2", "{\"a\": \"x\\",
                                               "{\"a\":{\"b\":tr", "{\"a\":\"\xE2\x82", "{\"a\":-0.5e"};
    for (const std::string& prefix : prefixes) {
        JsonPrefix s;
        ASSERT_TRUE(s.push(prefix));
        const std::vector<uint16_t> got = mask.after(s);
        int allowed = 0;
        for (int32_t id = 0; id < V; ++id) {
            uint16_t want = JsonTokenMask::kRefused;
            if (id < tok.n_vocab()) {
                const TokenType t = tok.vocab().types[size_t(id)];
                const std::string b = tok.token_bytes(id);
                JsonPrefix n = s;
                if ((t == TokenType::Normal || t == TokenType::Byte) && !b.empty() && n.push(b)) want = uint16_t(n.min_to_complete());
            }
            ASSERT_EQ(got[size_t(id)], want) << "prefix '" << prefix << "' token " << id;
            allowed += want != JsonTokenMask::kRefused;
        }
        EXPECT_GT(allowed, 0) << prefix;
    }
    // Special tokens (end of generation, <think>) are never JSON text.
    JsonPrefix done;
    ASSERT_TRUE(done.push("{}"));
    const std::vector<uint16_t>& none = mask.after(done);
    for (int32_t id = 0; id < V; ++id) ASSERT_EQ(none[size_t(id)], JsonTokenMask::kRefused) << id;
    for (const char* special : {"<|im_end|>", "<|endoftext|>", "<think>"})
        if (auto id = tok.find_token(special)) {
            EXPECT_EQ(mask.after(JsonPrefix())[size_t(*id)], JsonTokenMask::kRefused) << special;
        }
}

// Cost of one step's mask over the Qwen3 vocabulary (151k tokens): a scan (a state not seen
// before) and a cached state. Printed for the report; bounded loosely so a regression shows.
TEST(JsonTokenMask, CostPerStep) {
    const Tokenizer& tok = qwen3();
    auto t0 = std::chrono::steady_clock::now();
    JsonTokenMask mask(tok, tok.n_vocab());
    const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const std::vector<std::string> prefixes = {"{", "{\"key", "{\"a\":", "{\"a\": 12", "{\"a\": [", "{\"a\": \"text"};
    std::printf("JsonTokenMask: %d tokens (%zu precomputed inside strings), trie built in %.1f ms\n", tok.n_vocab(),
                mask.string_text_tokens(), build_ms);
    double worst = 0;
    for (const std::string& prefix : prefixes) {
        JsonPrefix s;
        ASSERT_TRUE(s.push(prefix));
        t0 = std::chrono::steady_clock::now();
        mask.after(s);
        const double scan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 10; ++i) mask.after(s);
        const double hit_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 10;
        std::printf("  state after '%s': scan %.2f ms, cached %.4f ms\n", prefix.c_str(), scan_ms, hit_ms);
        worst = std::max(worst, scan_ms);
    }
    EXPECT_GT(mask.cache_hits(), 0u);
    EXPECT_LT(worst, 100.0) << "a mask scan should cost a few ms";
}

}  // namespace
}  // namespace alloy
