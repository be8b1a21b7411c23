#include "tokenizer/normalize.h"

#include <utf8proc.h>

#include <cstdlib>

#include "alloy/error.h"
#include "tokenizer/utf8.h"

namespace alloy {
namespace {

void nfc_valid_run(std::string_view run, std::string& out) {
    bool ascii = true;
    for (unsigned char c : run) ascii = ascii && c < 0x80;
    if (ascii) { out.append(run); return; }  // ASCII is always in NFC
    utf8proc_uint8_t* mapped = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                            static_cast<utf8proc_ssize_t>(run.size()), &mapped,
                                            static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (n < 0) {  // cannot happen for validated input; keep the text rather than lose it
        out.append(run);
        return;
    }
    out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
    std::free(mapped);
}

}  // namespace

std::string nfc_normalize(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    size_t run = 0, i = 0;
    while (i < text.size()) {
        size_t len = 0;
        if (utf8::classify(text, i, &len) == utf8::Seq::Complete) { i += len; continue; }
        nfc_valid_run(text.substr(run, i - run), out);
        out.append(text.substr(i, len));  // invalid bytes pass through untouched
        i += len;
        run = i;
    }
    nfc_valid_run(text.substr(run), out);
    return out;
}

}  // namespace alloy
