// libFuzzer target: any byte string must either parse as safetensors or throw alloy::Error.
#include <cstddef>
#include <cstdint>

#include "alloy/error.h"
#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        auto f = alloy::SafetensorsFile::parse(data, size, "fuzz.safetensors");
        volatile uint64_t sink = 0;
        for (const auto& t : f->tensors()) {
            sink = sink + t.name.size() + t.shape.size() + t.nbytes;
            for (size_t i = 0; i < t.nbytes; ++i) sink = sink + t.data[i];
            if (t.nbytes <= (1u << 16)) sink = sink + f->to_f32(t).size();
        }
        (void)sink;
    } catch (const alloy::Error&) {
    }
    return 0;
}
