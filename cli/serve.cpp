// alloy serve: the OpenAI-compatible HTTP server (server/server.h) on one model.
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "alloy/engine.h"
#include "alloy/error.h"
#include "cli/common.h"
#include "alloy/server.h"

namespace alloy::cli {

namespace {
server::Server* g_server = nullptr;
void on_signal(int) {
    if (g_server) g_server->stop();
}
}  // namespace

void add_serve_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)");
    static ModelOptions eo;
    static std::string host = "127.0.0.1", alias, api_key, reasoning_format = "deepseek";
    static int port = 8080, parallel = 4, cache_ram = 2048, checkpoint_every = 1024;
    eo.add_to(cmd, false);
    cmd->add_option("--host", host, "address to listen on")->capture_default_str();
    cmd->add_option("--port", port, "port to listen on (0: any free port)")->capture_default_str();
    cmd->add_option("--parallel", parallel, "-np: requests served at once (state slots; --ctx is per request)")
        ->capture_default_str();
    cmd->add_option("-a,--alias", alias, "model name reported by /v1/models (default: the file name)");
    cmd->add_option("--cache-ram", cache_ram,
                    "prefix cache budget in MiB: states at the end of each prompt and generation (and every "
                    "--checkpoint-every prompt tokens) resume later prompts that start with them; 0: off")
        ->capture_default_str();
    cmd->add_option("--api-key", api_key,
                    "require \"Authorization: Bearer KEY\" on every endpoint but /health (default: $ALLOY_API_KEY)");
    cmd->add_option("--reasoning-format", reasoning_format,
                    "deepseek: chat reasoning in reasoning_content (thinking on); none: left in content")
        ->capture_default_str();
    cmd->add_option("--checkpoint-every", checkpoint_every, "prefix cache checkpoint interval inside long prompts, tokens")
        ->capture_default_str();
    cmd->callback([] {
        if (port < 0 || port > 65535) throw Error("--port must be in [0, 65535], got " + std::to_string(port));
        server::ServerOptions so;
        so.host = host;
        so.api_key = api_key;
        if (reasoning_format != "deepseek" && reasoning_format != "none")
            throw Error("--reasoning-format must be 'deepseek' or 'none', got '" + reasoning_format + "'");
        so.reasoning_format = reasoning_format;
        if (so.api_key.empty())
            if (const char* k = std::getenv("ALLOY_API_KEY")) so.api_key = k;
        so.port = port;
        const std::string path = eo.model_path();
        so.model_name = alias.empty() ? std::filesystem::path(path).filename().string() : alias;
        if (cache_ram < 0) throw Error("--cache-ram must be >= 0 (MiB), got " + std::to_string(cache_ram));
        if (checkpoint_every < 1) throw Error("--checkpoint-every must be >= 1, got " + std::to_string(checkpoint_every));
        EngineOptions e = eo.engine_options(parallel);
        e.cache_ram_mib = cache_ram;
        e.checkpoint_every = checkpoint_every;
        Engine engine(e);
        server::Server srv(engine, so);
        const int bound = srv.bind();
        g_server = &srv;
        std::signal(SIGINT, on_signal);
        std::signal(SIGTERM, on_signal);
        std::fprintf(stderr, "alloy serve: %s on http://%s:%d (%d requests at once, context %d tokens each)\n",
                     so.model_name.c_str(), host.c_str(), bound, parallel, eo.ctx);
        srv.listen();
        g_server = nullptr;
    });
}

}  // namespace alloy::cli
