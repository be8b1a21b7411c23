#include "tokenizer/byte_unicode.h"

#include <array>

#include "tokenizer/utf8.h"

namespace alloy::byte_unicode {
namespace {

struct Tables {
    std::array<std::string, 256> byte_to_text;
    std::array<int16_t, 512> cp_to_byte;  // code point -> byte, -1 if not in the mapping
    Tables() {
        cp_to_byte.fill(-1);
        uint32_t next = 256;
        for (uint32_t b = 0; b < 256; ++b) {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            const uint32_t cp = printable ? b : next++;
            byte_to_text[b] = utf8::encode(cp);
            cp_to_byte[cp] = static_cast<int16_t>(b);
        }
    }
};

const Tables& tables() {
    static const Tables t;
    return t;
}

}  // namespace

const std::string& from_byte(uint8_t b) { return tables().byte_to_text[b]; }

std::string to_bytes(std::string_view text) {
    const Tables& t = tables();
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        size_t len = 0;
        if (utf8::classify(text, i, &len) != utf8::Seq::Complete) {
            out.append(text.substr(i, len));  // malformed token text: keep its bytes
            i += len;
            continue;
        }
        const auto* p = reinterpret_cast<const uint8_t*>(text.data() + i);
        uint32_t cp = len == 1 ? p[0] : len == 2 ? ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu) : 0x10000;
        if (cp < t.cp_to_byte.size() && t.cp_to_byte[cp] >= 0) out += static_cast<char>(t.cp_to_byte[cp]);
        else out.append(text.substr(i, len));
        i += len;
    }
    return out;
}

std::string to_unicode(std::string_view s) {
    std::string out;
    out.reserve(s.size() * 2);
    for (unsigned char c : s) out += from_byte(c);
    return out;
}

}  // namespace alloy::byte_unicode
