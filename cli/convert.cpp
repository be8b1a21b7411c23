// PLACEHOLDER during development: replaced by the real command before any commit.
#include "cli/commands.h"
#include "alloy/error.h"
namespace alloy::cli {
void add_convert_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("convert", "(not built yet)");
    cmd->callback([] { throw Error("convert: not built yet"); });
}
}  // namespace alloy::cli
