// PLACEHOLDER during development: replaced by the real command before any commit.
#include "cli/commands.h"
#include "alloy/error.h"
namespace alloy::cli {
void add_perplexity_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("perplexity", "(not built yet)");
    cmd->callback([] { throw Error("perplexity: not built yet"); });
}
}  // namespace alloy::cli
