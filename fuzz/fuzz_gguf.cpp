// libFuzzer target: any byte string must either parse as GGUF or throw alloy::Error.
// Everything the reader hands out (metadata, tensor infos, tensor bytes) is touched so that
// ASan sees any pointer that escaped the buffer.
#include <cstddef>
#include <cstdint>

#include "alloy/error.h"
#include "format/gguf.h"
#include "format/quant.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace alloy;
    try {
        auto f = gguf::File::parse(data, size, "fuzz.gguf");
        volatile uint64_t sink = f->version() + f->alignment();
        for (const auto& [key, v] : f->metadata()) {
            sink = sink + key.size() + v.s.size() + v.array_size() + static_cast<uint64_t>(v.i) + v.u;
            for (const std::string& s : v.strs) sink = sink + s.size();
            for (int64_t x : v.ints) sink = sink + static_cast<uint64_t>(x);
            for (double x : v.floats) sink = sink + (x == x);
            // The typed getters must also only ever throw alloy::Error.
            try { sink = sink + f->get_u32(key); } catch (const Error&) {}
            try { sink = sink + static_cast<uint64_t>(f->get_f32(key)); } catch (const Error&) {}
            try { sink = sink + f->get_string(key).size(); } catch (const Error&) {}
            try { sink = sink + f->get_int_array(key).size(); } catch (const Error&) {}
        }
        for (const gguf::TensorInfo& t : f->tensors()) {
            sink = sink + static_cast<uint64_t>(t.n_elements()) + t.offset + t.nbytes;
            for (size_t i = 0; i < t.nbytes; ++i) sink = sink + t.data[i];
            // Dequantize the first row when it is small: exercises the block decoders.
            if (t.ne[0] > 0 && t.ne[0] <= 4096 && row_bytes(t.type, t.ne[0]) <= t.nbytes) {
                float row[4096];
                dequantize_row(t.type, t.data, row, t.ne[0]);
                sink = sink + (row[0] == row[0]);
            }
        }
        (void)sink;
    } catch (const alloy::Error&) {
    }
    return 0;
}
