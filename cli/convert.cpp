// alloy convert: Hugging Face Qwen3.5 checkpoint -> GGUF as llama.cpp's converter writes it.
#include <cstdio>

#include "alloy/convert.h"
#include "cli/common.h"

namespace alloy::cli {

void add_convert_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("convert", "convert a Hugging Face Qwen3.5 checkpoint to GGUF");
    static ConvertRequest req;
    static bool no_mtp = false;
    cmd->add_option("hf_dir", req.hf_dir, "checkpoint directory (config.json + *.safetensors)")->required();
    cmd->add_option("-o,--output", req.out_path, "output .gguf")->required();
    cmd->add_option("--dtype", req.dtype, "matrix type: f32 | f16 | bf16 | q8_0")->capture_default_str();
    cmd->add_option("--tokenizer", req.tokenizer_json, "tokenizer.json (default: the one in hf_dir)");
    cmd->add_flag("--no-mtp", no_mtp, "drop the MTP block");
    cmd->callback([] {
        req.keep_mtp = !no_mtp;
        std::fprintf(stderr, "%s\n", convert_model(req).c_str());
    });
}

}  // namespace alloy::cli
