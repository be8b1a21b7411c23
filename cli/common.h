// Options and small helpers shared by several subcommands.
#pragma once
#include <string>
#include <vector>

#include "cli/commands.h"
#include "format/ggml_types.h"
#include "model/qwen35.h"

namespace alloy::cli {

// Options every model-running command takes.
struct EngineOptions {
    std::string model;       // empty: the embedded default model
    std::string gdn = "chunked";
    int chunk = 64;
    int ctx = 4096;
    int threads = 0;         // 0: all cores
    int batch = 512;         // longest prefill piece (llama.cpp's ubatch)
    void add_to(CLI::App* cmd, bool model_required);
    ForwardOptions forward_options() const;  // validates gdn/chunk; sets the thread count
    std::string model_path() const;          // resolves the default model
};

// "1 2 3" or "1,2,3" -> ids; throws naming the bad entry.
std::vector<int32_t> parse_ids(const std::string& text);
// f32 | f16 | bf16 | q8_0
GgmlType parse_dtype(const std::string& s);

}  // namespace alloy::cli
