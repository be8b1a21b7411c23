// alloy synth: a random-weight Qwen3.5 model of a named size, loadable by llama.cpp too.
#include <cstdio>

#include "cli/common.h"
#include "model/synth.h"

namespace alloy::cli {

void add_synth_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("synth", "write a synthetic (random-weight) Qwen3.5 GGUF");
    static SynthOptions opt;
    static std::string dtype = "q8_0";
    cmd->add_option("--preset", opt.preset, "tiny | 0.8b | 2b | 4b | 9b | 27b | moe-tiny | 35b-a3b")->capture_default_str();
    cmd->add_option("--dtype", dtype, "matrix type: f32 | f16 | bf16 | q8_0")->capture_default_str();
    cmd->add_option("--tokenizer", opt.tokenizer_json, "HF tokenizer.json to embed (default: the bundled Qwen3 one)");
    cmd->add_option("--seed", opt.seed, "random seed")->capture_default_str();
    cmd->add_option("--layers", opt.n_layer, "layer count instead of the preset's (every 4th is attention)");
    cmd->add_option("-o,--output", opt.out_path, "output .gguf")->required();
    cmd->callback([] {
        opt.dtype = parse_dtype(dtype);
        if (opt.tokenizer_json.empty()) opt.tokenizer_json = std::string(ALLOY_ASSETS_DIR) + "/qwen3-tokenizer/tokenizer.json";
        std::fprintf(stderr, "%s\n", synth_qwen35(opt).c_str());
    });
}

}  // namespace alloy::cli
