// alloy synth: a random-weight Qwen3.5 model of a named size, loadable by llama.cpp too.
#include <cstdio>

#include "alloy/synth.h"
#include "cli/commands.h"

namespace alloy::cli {

void add_synth_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("synth", "write a synthetic (random-weight) Qwen3.5 GGUF");
    static SynthRequest req;
    cmd->add_option("--preset", req.preset, "tiny | tiny-mqa | 0.8b | 2b | 4b | 9b | 27b | moe-tiny | 35b-a3b")->capture_default_str();
    cmd->add_option("--dtype", req.dtype, "matrix type: f32 | f16 | bf16 | q8_0")->capture_default_str();
    cmd->add_option("--tokenizer", req.tokenizer_json, "vocabulary to embed: tokenizer.json, .gguf or .tiktoken (default: the bundled Qwen3.5 / 3.6 one)");
    cmd->add_option("--seed", req.seed, "random seed")->capture_default_str();
    cmd->add_option("--layers", req.n_layer, "layer count instead of the preset's (every 4th is attention)");
    cmd->add_flag("--mtp", req.mtp, "also an MTP block after the layers (as in published Qwen3.5 files; random like the rest)");
    cmd->add_option("-o,--output", req.out_path, "output .gguf")->required();
    cmd->callback([] { std::fprintf(stderr, "%s\n", synth_model(req).c_str()); });
}

}  // namespace alloy::cli
