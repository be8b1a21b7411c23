// alloy convert: Hugging Face Qwen3.5 checkpoint -> GGUF as llama.cpp's converter writes it.
#include <cstdio>

#include "cli/common.h"
#include "model/convert_qwen35.h"

namespace alloy::cli {

void add_convert_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("convert", "convert a Hugging Face Qwen3.5 checkpoint to GGUF");
    static ConvertOptions opt;
    static std::string dtype = "bf16";
    static bool no_mtp = false;
    cmd->add_option("hf_dir", opt.hf_dir, "checkpoint directory (config.json + *.safetensors)")->required();
    cmd->add_option("-o,--output", opt.out_path, "output .gguf")->required();
    cmd->add_option("--dtype", dtype, "matrix type: f32 | f16 | bf16 | q8_0")->capture_default_str();
    cmd->add_option("--tokenizer", opt.tokenizer_json, "tokenizer.json (default: the one in hf_dir)");
    cmd->add_flag("--no-mtp", no_mtp, "drop the MTP block");
    cmd->callback([] {
        opt.dtype = parse_dtype(dtype);
        opt.keep_mtp = !no_mtp;
        std::fprintf(stderr, "%s\n", convert_hf_qwen35(opt).c_str());
    });
}

}  // namespace alloy::cli
