// Grammar-constrained sampling for JSON output (the server's response_format json_object):
// a byte-level JSON prefix automaton and, over a vocabulary, the set of tokens whose bytes
// keep the text a JSON prefix.
//
// JsonPrefix accepts exactly the prefixes of RFC 8259 JSON texts that are valid UTF-8 (what
// nlohmann::json::parse accepts), with three limits that keep a sampler from wandering
// forever or producing what a parser refuses: no whitespace before the top-level value and at
// most kMaxWhitespace whitespace bytes in a row elsewhere, nesting at most kMaxDepth containers, and no \u escape of a UTF-16 surrogate (any
// character can still be written as UTF-8; a lone surrogate escape is refused by parsers).
// With object_only the top-level value must be an object ({"type": "json_object"}).
//
// JsonTokenMask walks a trie of the vocabulary's token bytes from a state, so shared prefixes
// are simulated once and a byte that breaks the prefix prunes every token below it; results
// are cached by state (a long string stays in one state for many steps). For each token it
// gives the bytes the shortest completion needs after it (min_to_complete), which lets the
// engine keep a generation completable within its remaining token budget: every byte is a
// token of a byte-level vocabulary, so n bytes always fit in n tokens.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace alloy {

class Tokenizer;

class JsonPrefix {
public:
    static constexpr int kMaxDepth = 32;
    static constexpr int kMaxWhitespace = 16;

    explicit JsonPrefix(bool object_only = true);
    // Appends a byte; false when the text would no longer be a JSON prefix (the state is then
    // unspecified: push into a copy when the byte may be refused).
    bool push(unsigned char c);
    bool push(std::string_view bytes);  // every byte, or false
    bool complete() const;              // the text is one whole JSON value (nothing may follow)
    int min_to_complete() const;        // bytes the shortest completion appends (0: complete)

    // Inside a string, between characters: the state most steps of a long string are in.
    bool in_string() const { return mode_ == kString; }
    int utf8_left() const { return mode_ == kUtf8 ? left_ : 0; }  // continuation bytes a character still needs

    bool operator==(const JsonPrefix& o) const;
    size_t hash() const;

private:
    enum Mode : uint8_t {
        kValue, kArrFirst, kObjFirst, kObjKey, kColon, kAfter, kDone,
        kString, kEscape, kHex, kUtf8,
        kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits,
        kLiteral,
    };
    bool value_start(unsigned char c);
    void value_done();
    bool number_end(unsigned char c);  // a byte after a complete number

    uint64_t objects_ = 0;  // bit d: the container at depth d + 1 is an object (else an array)
    uint8_t depth_ = 0;     // open containers
    uint8_t mode_ = kValue;
    uint8_t left_ = 0;      // kHex: hex digits left; kUtf8: continuation bytes left; kLiteral: bytes matched
    uint8_t lo_ = 0, hi_ = 0;  // kUtf8: the next byte's range; kHex: lo_ = 1 after a first digit d/D; kLiteral: lo_ = which
    uint8_t ws_ = 0;        // whitespace bytes in a row
    bool key_ = false;      // the string being read is an object key
    bool object_only_ = true;
};

struct JsonPrefixHash {
    size_t operator()(const JsonPrefix& s) const { return s.hash(); }
};

class JsonTokenMask {
public:
    static constexpr uint16_t kRefused = 0xFFFF;
    // The text tokens of the vocabulary (Normal and Byte types; control and user-defined
    // tokens are markup, never JSON text); ids in [tokenizer size, n_vocab) are refused.
    JsonTokenMask(const Tokenizer& tokenizer, int n_vocab);
    // [n_vocab]: for each token, min_to_complete of the state after its bytes (capped at
    // kRefused - 1), or kRefused when a byte breaks the prefix. Valid until the next call.
    const std::vector<uint16_t>& after(const JsonPrefix& s);
    int n_vocab() const { return n_vocab_; }
    std::string_view token(int32_t id) const { return bytes_[size_t(id)]; }
    size_t string_text_tokens() const { return string_text_.size(); }  // precomputed inside strings
    size_t cache_hits() const { return hits_; }
    size_t cache_misses() const { return misses_; }

private:
    struct Node {
        uint32_t child_begin = 0, child_end = 0;  // children: nodes [begin, end), by byte
        uint32_t tok_begin = 0, tok_end = 0;      // tokens ending here: toks_[begin, end)
        unsigned char byte = 0;
    };
    void scan(const JsonPrefix& s, std::vector<uint16_t>& out) const;

    int n_vocab_;
    std::vector<std::string> bytes_;  // [n_vocab] a token's bytes (empty: never JSON text)
    std::vector<Node> nodes_;         // nodes_[0] the root
    std::vector<int32_t> toks_;
    // Inside a string (in_string()) a token without a quote, backslash or control byte acts
    // the same from every such state: refused (broken UTF-8) or accepted, ending between
    // characters or inside one with `extra` continuation bytes to come, its min_to_complete
    // that many above the state's. Those are precomputed (string_text_: id, extra); only the
    // rest (string_other_: a quote or backslash, a few thousand) are simulated there. The trie
    // walk would visit nearly every node in a string (~7 ms for 151k tokens).
    std::vector<std::pair<int32_t, uint8_t>> string_text_;
    std::vector<int32_t> string_other_;
    // Cache by state, least recently used evicted (each entry is n_vocab * 2 bytes).
    static constexpr size_t kCacheEntries = 16;
    std::list<std::pair<JsonPrefix, std::vector<uint16_t>>> lru_;
    std::unordered_map<JsonPrefix, decltype(lru_)::iterator, JsonPrefixHash> index_;
    size_t hits_ = 0, misses_ = 0;
};

}  // namespace alloy
