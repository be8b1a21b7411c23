// libFuzzer target for the tokenizer's inputs. The first byte picks what the rest is:
//   0: a tokenizer.json (Tokenizer::from_hf_json_text),
//   1: a GGUF file whose tokenizer.ggml.* keys are read (Tokenizer::from_gguf),
//   2: text for the real Qwen3 vocabulary (testdata/qwen3-tokenizer) to encode and decode,
//   3: a tiktoken ranks file (qwen35_vocab_from_tiktoken_text).
// A loader must either give a working tokenizer or throw alloy::Error; encoding any bytes,
// decoding the ids and streaming them back must never fail. Checked properties (a violation
// traps): every id is in range; the stream decoder returns valid UTF-8 only; with NFC off,
// decode(encode(text)) == text for any bytes (tokenizer.h's contract).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "alloy/error.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using alloy::Tokenizer;

void check(bool ok) {
    if (!ok) __builtin_trap();
}

// Encodes text both ways, decodes, streams; `roundtrip`: decode(encode(text, false)) == text.
void exercise(const Tokenizer& tok, std::string_view text, bool roundtrip) {
    for (bool special : {false, true}) {
        const std::vector<int32_t> ids = tok.encode(text, special);
        for (int32_t id : ids) check(id >= 0 && id < tok.n_vocab());
        const std::string back = tok.decode(ids);
        if (roundtrip && !special) check(back == text);
        alloy::StreamDecoder sd(tok);
        std::string streamed;
        for (int32_t id : ids) {
            const std::string piece = sd.push(id);
            check(alloy::utf8::is_valid(piece));
            streamed += piece;
        }
        const std::string tail = sd.flush();
        check(alloy::utf8::is_valid(tail));
        if (alloy::utf8::is_valid(back)) check(streamed + tail == back);
    }
}

const Tokenizer& qwen3() {
    static const Tokenizer t = Tokenizer::from_hf_json(ALLOY_FUZZ_VOCAB);
    return t;
}

// The same vocabulary without NFC (as Qwen3.5's tokenizer), where the round trip is exact.
const Tokenizer& qwen3_raw() {
    static const Tokenizer t = [] {
        alloy::Vocab v = qwen3().vocab();
        v.nfc = false;
        v.pre = alloy::PreTokenizer::Qwen35;
        return Tokenizer(std::move(v));
    }();
    return t;
}

const char* const kSample = "Hello, world! 123 4567 \xe4\xbd\xa0\xe5\xa5\xbd <|im_start|>user\n caf\xc3\xa9 \xff\xfe";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
    try {
        switch (data[0] % 4) {
            case 0: {
                const Tokenizer tok = Tokenizer::from_hf_json_text(rest, "fuzz/tokenizer.json");
                exercise(tok, kSample, false);
                exercise(tok, rest.substr(0, 256), false);
                break;
            }
            case 1: {
                auto f = alloy::gguf::File::parse(data + 1, size - 1, "fuzz.gguf");
                const Tokenizer tok = Tokenizer::from_gguf(*f);
                exercise(tok, kSample, false);
                break;
            }
            case 3: {
                const Tokenizer tok(alloy::qwen35_vocab_from_tiktoken_text(rest, "fuzz.tiktoken"));
                exercise(tok, kSample, false);
                break;
            }
            default:
                exercise(qwen3(), rest, false);
                exercise(qwen3_raw(), rest, true);
                break;
        }
    } catch (const alloy::Error&) {
    }
    return 0;
}
