# Writes OUT = a header defining the bytes of IN as `inline constexpr unsigned char NAME[]`
# (no terminating zero) and NAME_size, so a file shipped in the repo (the chat page,
# server/web/index.html) is part of the binary and served without reading anything at run time.
# Bytes, not a string literal: any content is safe (no delimiter to escape, no length limit).
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR size "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE ${OUT} "// Generated from ${IN} by cmake/embed_file.cmake; do not edit.\n#pragma once\n#include <cstddef>\n"
     "inline constexpr unsigned char ${NAME}[] = {\n${bytes}};\ninline constexpr std::size_t ${NAME}_size = ${size};\n")
