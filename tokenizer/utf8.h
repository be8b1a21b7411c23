// UTF-8 helpers shared by the tokenizer: strict validation (RFC 3629, no overlongs or
// surrogates, the same notion of "valid" that PCRE2 and utf8proc use) and encoding.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace alloy::utf8 {

enum class Seq { Complete, Incomplete, Invalid };

// Classifies the sequence starting at s[i]. Complete: *len = its length (1..4).
// Incomplete: the bytes up to the end of s are a valid prefix of a longer character
// (*len = bytes present). Invalid: *len = length of the maximal invalid subpart (>= 1),
// which is what a decoder replaces by one U+FFFD (Unicode "best practice").
Seq classify(std::string_view s, size_t i, size_t* len);

bool is_valid(std::string_view s);
std::string encode(uint32_t cp);

// Replaces every invalid subpart by U+FFFD; valid input is returned unchanged.
std::string sanitize(std::string_view s);

}  // namespace alloy::utf8
