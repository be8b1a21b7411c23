// A vocabulary as a Hugging Face tokenizer.json, in the shape of the Qwen tokenizer files
// (testdata/qwen3-tokenizer/tokenizer.json): byte-level BPE with its merges as [left, right]
// pairs, the Split pre-tokenizer with the vocabulary's regex then ByteLevel, NFC when the
// vocabulary normalizes, the Control and UserDefined tokens as added tokens (special: true
// for Control). HF `tokenizers` and Tokenizer::from_hf_json read it back.
#include <nlohmann/json.hpp>

#include <unordered_set>
#include <vector>

#include "alloy/error.h"
#include "tokenizer/pre_tokenize.h"
#include "tokenizer/tokenizer.h"

namespace alloy {

std::string vocab_to_hf_json(const Vocab& v) {
    using nlohmann::json;
    using ordered = nlohmann::ordered_json;
    if (v.types.size() != v.tokens.size()) throw Error("vocab_to_hf_json: tokens and types differ in length");
    const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                             {"use_regex", false}};
    ordered added = ordered::array(), vocab = ordered::object(), merges = ordered::array();
    std::unordered_set<std::string> seen;
    for (size_t id = 0; id < v.tokens.size(); ++id) {
        const TokenType t = v.types[id];
        if (t == TokenType::Control || t == TokenType::UserDefined) {
            added.push_back({{"id", id}, {"content", v.tokens[id]}, {"single_word", false}, {"lstrip", false},
                             {"rstrip", false}, {"normalized", false}, {"special", t == TokenType::Control}});
        } else if (t != TokenType::Unused) {  // padding ids ([PAD..]) are left out, as HF files do
            // Appended without ordered_json's linear key search (248k tokens: 67 s -> 1 s); a
            // text seen before keeps its first id, as the tokenizer's lookup does.
            if (seen.insert(v.tokens[id]).second)
                static_cast<std::vector<ordered::object_t::value_type>&>(vocab.get_ref<ordered::object_t&>())
                    .emplace_back(v.tokens[id], id);
        }
    }
    for (const std::string& m : v.merges) {
        const size_t sp = m.find(' ');
        if (sp == std::string::npos) throw Error("vocab_to_hf_json: merge '" + m + "' is not 'left right'");
        merges.push_back({m.substr(0, sp), m.substr(sp + 1)});
    }
    ordered j = ordered::object();
    j["version"] = "1.0";
    j["truncation"] = nullptr;
    j["padding"] = nullptr;
    j["added_tokens"] = std::move(added);
    j["normalizer"] = v.nfc ? json{{"type", "NFC"}} : json(nullptr);
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"},
                             {"pattern", {{"Regex", pre_tokenizer_regex(v.pre)}}},
                             {"behavior", "Isolated"},
                             {"invert", false}},
                            byte_level}}};
    j["post_processor"] = byte_level;
    j["decoder"] = byte_level;
    ordered model = ordered::object();
    model["type"] = "BPE";
    model["dropout"] = nullptr;
    model["unk_token"] = nullptr;
    model["continuing_subword_prefix"] = "";
    model["end_of_word_suffix"] = "";
    model["fuse_unk"] = false;
    model["byte_fallback"] = false;
    model["ignore_merges"] = false;
    model["vocab"] = std::move(vocab);
    model["merges"] = std::move(merges);
    j["model"] = std::move(model);
    return j.dump(1, ' ', false, json::error_handler_t::strict);
}

}  // namespace alloy
