// PLACEHOLDER during development: replaced by the real command before any commit.
#include "cli/commands.h"
#include "alloy/error.h"
namespace alloy::cli {
void add_tokenize_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("tokenize", "(not built yet)");
    cmd->callback([] { throw Error("tokenize: not built yet"); });
}
}  // namespace alloy::cli
