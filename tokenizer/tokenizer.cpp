// Tokenizer core: vocabulary checks, encode (special tokens -> NFC -> regex split -> BPE),
// decode. Loading lives in load_hf_json.cpp and gguf_vocab.cpp.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <unordered_map>

#include "alloy/error.h"
#include "format/gguf.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_unicode.h"
#include "tokenizer/normalize.h"
#include "tokenizer/pre_tokenize.h"

namespace alloy {

struct Tokenizer::Impl {
    Vocab vocab;
    std::unordered_map<std::string, int32_t> token_to_id;  // first id wins on duplicates
    std::vector<std::string> id_bytes;                     // id -> decoded bytes
    std::array<int32_t, 256> byte_id{};                    // byte -> its single-character token
    BpeMerges merges;
    // Verbatim-matched tokens, longest first so the first hit at a position is the longest.
    std::vector<std::pair<std::string, int32_t>> specials;
    std::array<bool, 256> special_first{};  // bytes that start some special token
    int32_t im_end = -1, endoftext = -1;

    explicit Impl(Vocab v);
    void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
};

namespace {

void check_id(int32_t id, int32_t n, const char* field) {
    if (id < -1 || id >= n)
        throw Error(std::string("tokenizer vocab: ") + field + " = " + std::to_string(id) +
                    " is outside the vocabulary of " + std::to_string(n) + " tokens");
}

}  // namespace

Tokenizer::Impl::Impl(Vocab v) : vocab(std::move(v)) {
    const auto n = static_cast<int32_t>(vocab.tokens.size());
    if (n == 0) throw Error("tokenizer vocab: no tokens");
    if (vocab.types.size() != vocab.tokens.size())
        throw Error("tokenizer vocab: " + std::to_string(vocab.tokens.size()) + " tokens but " +
                    std::to_string(vocab.types.size()) + " token types");
    check_id(vocab.eos_id, n, "eos_id");
    check_id(vocab.pad_id, n, "pad_id");
    check_id(vocab.bos_id, n, "bos_id");

    token_to_id.reserve(vocab.tokens.size());
    id_bytes.resize(vocab.tokens.size());
    for (int32_t id = 0; id < n; ++id) {
        const std::string& text = vocab.tokens[id];
        token_to_id.try_emplace(text, id);
        switch (vocab.types[id]) {
            case TokenType::Normal:
            case TokenType::Byte:
            case TokenType::Unknown: id_bytes[id] = byte_unicode::to_bytes(text); break;
            case TokenType::Control:
            case TokenType::UserDefined:
                id_bytes[id] = text;
                if (!text.empty()) specials.emplace_back(text, id);
                break;
            case TokenType::Unused: break;
            default:
                throw Error("tokenizer vocab: token " + std::to_string(id) + " has unknown type " +
                            std::to_string(static_cast<int>(vocab.types[id])));
        }
    }
    std::stable_sort(specials.begin(), specials.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    for (const auto& s : specials) special_first[static_cast<uint8_t>(s.first[0])] = true;

    // Byte-level BPE can only encode arbitrary text if every byte has a token.
    for (int b = 0; b < 256; ++b) {
        auto it = token_to_id.find(byte_unicode::from_byte(static_cast<uint8_t>(b)));
        if (it == token_to_id.end())
            throw Error("tokenizer vocab: no token for byte 0x" + std::string(1, "0123456789abcdef"[b >> 4]) +
                        "0123456789abcdef"[b & 15] + " (byte-level BPE needs all 256)");
        byte_id[b] = it->second;
    }

    for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
        const std::string& m = vocab.merges[rank];
        const size_t sp = m.find(' ', 1);
        if (sp == std::string::npos || sp + 1 >= m.size())
            throw Error("tokenizer vocab: merge " + std::to_string(rank) + " '" + m +
                        "' is not two tokens separated by a space");
        const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
        auto l = token_to_id.find(left), r = token_to_id.find(right), lr = token_to_id.find(left + right);
        if (l == token_to_id.end() || r == token_to_id.end() || lr == token_to_id.end())
            throw Error("tokenizer vocab: merge " + std::to_string(rank) + " '" + m +
                        "' uses or makes a token that is not in the vocabulary");
        merges.add(l->second, r->second, lr->second, static_cast<int32_t>(rank));
    }

    if (auto it = token_to_id.find("<|im_end|>"); it != token_to_id.end()) im_end = it->second;
    if (auto it = token_to_id.find("<|endoftext|>"); it != token_to_id.end()) endoftext = it->second;
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::string normalized;
    if (vocab.nfc) {
        normalized = nfc_normalize(text);
        text = normalized;
    }
    thread_local std::vector<std::pair<size_t, size_t>> pieces;
    thread_local std::vector<int32_t> word;
    split_pieces(text, vocab.pre, pieces);
    for (auto [b, e] : pieces) {
        word.clear();
        for (size_t i = b; i < e; ++i) word.push_back(byte_id[static_cast<uint8_t>(text[i])]);
        merges.apply(word);
        out.insert(out.end(), word.begin(), word.end());
    }
}

Tokenizer::Tokenizer(Vocab vocab) : impl_(std::make_unique<Impl>(std::move(vocab))) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_path(const std::string& path) {
    const bool gguf = path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
    if (gguf) {
        auto file = gguf::File::open(path);
        return from_gguf(*file);
    }
    if (path.size() >= 9 && path.compare(path.size() - 9, 9, ".tiktoken") == 0)
        return Tokenizer(qwen35_vocab_from_tiktoken(path));
    return from_hf_json(path);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    if (!parse_special || impl_->specials.empty()) {
        impl_->encode_plain(text, out);
        return out;
    }
    // Leftmost-longest verbatim match of added tokens (what HF's Aho-Corasick does); the
    // text between matches is encoded on its own, so NFC and the regex never cross a token.
    size_t plain = 0;
    for (size_t i = 0; i < text.size();) {
        int32_t hit = -1;
        size_t hit_len = 0;
        if (impl_->special_first[static_cast<uint8_t>(text[i])]) {
            for (const auto& [s, id] : impl_->specials) {
                if (text.compare(i, s.size(), s) == 0) { hit = id; hit_len = s.size(); break; }
            }
        }
        if (hit < 0) { ++i; continue; }
        impl_->encode_plain(text.substr(plain, i - plain), out);
        out.push_back(hit);
        i += hit_len;
        plain = i;
    }
    impl_->encode_plain(text.substr(plain), out);
    return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
    if (id < 0 || id >= n_vocab())
        throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " +
                    std::to_string(n_vocab()) + " tokens");
    return impl_->id_bytes[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
    std::string out;
    for (int32_t id : ids) {
        if (id < 0 || id >= n_vocab())
            throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " +
                        std::to_string(n_vocab()) + " tokens");
        out += impl_->id_bytes[id];
    }
    return out;
}

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->vocab.tokens.size()); }

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
    auto it = impl_->token_to_id.find(std::string(text));
    if (it == impl_->token_to_id.end()) return std::nullopt;
    return it->second;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
    return id >= 0 && (id == impl_->vocab.eos_id || id == impl_->im_end || id == impl_->endoftext);
}

const Vocab& Tokenizer::vocab() const { return impl_->vocab; }

}  // namespace alloy
