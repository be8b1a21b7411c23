// PLACEHOLDER during development: replaced by the real command before any commit.
#include "cli/commands.h"
#include "alloy/error.h"
namespace alloy::cli {
void add_test_ops_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("test-ops", "(not built yet)");
    cmd->callback([] { throw Error("test-ops: not built yet"); });
}
}  // namespace alloy::cli
