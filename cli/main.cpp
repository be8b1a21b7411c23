// alloy: one executable, one subcommand per file in cli/.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "alloy/error.h"

int main(int argc, char** argv) {
    CLI::App app{"alloy: inference engine for Qwen3.5 hybrid linear-attention models"};
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "help for every subcommand");
    alloy::cli::add_run_command(app);
    alloy::cli::add_logits_command(app);
    alloy::cli::add_perplexity_command(app);
    alloy::cli::add_synth_command(app);
    alloy::cli::add_convert_command(app);
    alloy::cli::add_quantize_command(app);
    alloy::cli::add_tokenize_command(app);
    alloy::cli::add_test_ops_command(app);
    alloy::cli::add_bench_command(app);
    alloy::cli::add_batched_bench_command(app);
    alloy::cli::add_profile_command(app);
    alloy::cli::add_serve_command(app);
    // -ctk/-ctv (llama.cpp's spelling) -> --cache-type-k/v; CLI11 takes the rest as is.
    std::vector<std::string> args(argv, argv + argc);
    alloy::cli::rewrite_llama_style_flags(args);
    std::vector<char*> argp;
    for (std::string& a : args) argp.push_back(a.data());
    try {
        app.parse(int(argp.size()), argp.data());
    } catch (const CLI::ParseError& e) {
        return app.exit(e);  // unknown flags, missing values: message + non-zero exit
    } catch (const alloy::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "error: out of memory\n");
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
