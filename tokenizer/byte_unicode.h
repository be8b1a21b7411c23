// GPT-2 byte-level mapping: every byte 0..255 is shown as one printable Unicode character,
// so that BPE works on text without raw control bytes or spaces. Printable Latin-1 bytes
// map to themselves; the other 68 bytes map to U+0100.. in byte order (space -> 'Ġ' U+0120,
// '\n' -> 'Ċ' U+010A).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace alloy::byte_unicode {

// UTF-8 text of the character that stands for byte b.
const std::string& from_byte(uint8_t b);
// Maps a byte-level token text back to raw bytes. Characters outside the mapping (never in
// a well-formed byte-level vocabulary) are kept as their own UTF-8 so nothing is lost.
std::string to_bytes(std::string_view token_text);
// Byte-level form of raw bytes (the concatenation of from_byte over s).
std::string to_unicode(std::string_view s);

}  // namespace alloy::byte_unicode
