// Each subcommand lives in its own file and registers itself on the root CLI11 app.
// A command's callback throws alloy::Error for bad input; main() prints it and exits 1.
#pragma once
#include <CLI/CLI.hpp>

namespace alloy::cli {

void add_run_command(CLI::App& app);
void add_logits_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);
void add_synth_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_test_ops_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_profile_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_batched_bench_command(CLI::App& app);

}  // namespace alloy::cli
