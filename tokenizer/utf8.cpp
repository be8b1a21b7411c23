#include "tokenizer/utf8.h"

namespace alloy::utf8 {

Seq classify(std::string_view s, size_t i, size_t* len) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    if (b0 < 0x80) { *len = 1; return Seq::Complete; }
    size_t need = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Table 3-7)
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 2;
    else if (b0 == 0xE0) { need = 3; lo = 0xA0; }
    else if (b0 >= 0xE1 && b0 <= 0xEC) need = 3;
    else if (b0 == 0xED) { need = 3; hi = 0x9F; }  // excludes surrogates
    else if (b0 >= 0xEE && b0 <= 0xEF) need = 3;
    else if (b0 == 0xF0) { need = 4; lo = 0x90; }
    else if (b0 >= 0xF1 && b0 <= 0xF3) need = 4;
    else if (b0 == 0xF4) { need = 4; hi = 0x8F; }  // nothing above U+10FFFF
    else { *len = 1; return Seq::Invalid; }
    for (size_t k = 1; k < need; ++k) {
        if (i + k >= s.size()) { *len = k; return Seq::Incomplete; }
        const auto b = static_cast<uint8_t>(s[i + k]);
        const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) { *len = k; return Seq::Invalid; }
    }
    *len = need;
    return Seq::Complete;
}

bool is_valid(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        size_t len = 0;
        if (classify(s, i, &len) != Seq::Complete) return false;
        i += len;
    }
    return true;
}

std::string encode(uint32_t cp) {
    std::string out;
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return out;
}

std::string sanitize(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        size_t len = 0;
        if (classify(s, i, &len) == Seq::Complete) out.append(s.substr(i, len));
        else out += "\xEF\xBF\xBD";  // U+FFFD for an invalid or truncated subpart
        i += len;
    }
    return out;
}

}  // namespace alloy::utf8
