// alloy serve: the OpenAI-compatible HTTP server (server/server.h) on one model.
#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "alloy/engine.h"
#include "alloy/error.h"
#include "cli/common.h"
#include "alloy/server.h"

namespace alloy::cli {

namespace {

// SIGINT/SIGTERM, taken by one thread with sigwait (so the shutdown runs as ordinary code, not
// in a signal handler): the first drains (server::Server::shutdown: no new connections, the
// requests in flight finish, cancelled after `timeout_s`), a second cancels what is left now.
// Blocked in every thread before any is started, so only this one ever sees them; before the
// server is attached (the model still loading) a signal ends the process as it would unhandled.
class SignalDrain {
public:
    SignalDrain() {
        sigemptyset(&set_);
        sigaddset(&set_, SIGINT);
        sigaddset(&set_, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &set_, nullptr);
        waiter_ = std::thread([this] { wait(); });
    }
    ~SignalDrain() { finish(); }
    void attach(server::Server& srv, double timeout_s) {
        timeout_s_ = timeout_s;
        srv_ = &srv;
    }
    // After listen() returned: wake the waiter (if no signal came) and wait for the drain.
    void finish() {
        if (!waiter_.joinable()) return;
        served_ = true;
        pthread_kill(waiter_.native_handle(), SIGTERM);
        waiter_.join();
    }

private:
    void wait() {
        std::thread drain;
        for (int n = 0;; ++n) {
            int sig = 0;
            sigwait(&set_, &sig);
            if (served_) break;  // woken by finish()
            server::Server* srv = srv_;
            if (!srv) {  // still loading: the default action (the process ends by the signal)
                std::signal(sig, SIG_DFL);
                pthread_sigmask(SIG_UNBLOCK, &set_, nullptr);
                raise(sig);
                return;
            }
            if (n == 0) {
                std::fprintf(stderr, "alloy serve: %s: accepting no new connections; %d request(s) in flight get up to %g s\n",
                             sig == SIGINT ? "SIGINT" : "SIGTERM", srv->in_flight(), timeout_s_);
                drain = std::thread([srv, t = timeout_s_] {
                    const int cancelled = srv->shutdown(t);
                    if (cancelled > 0) std::fprintf(stderr, "alloy serve: cancelled %d request(s) at the timeout\n", cancelled);
                });
            } else {
                std::fprintf(stderr, "alloy serve: second signal: cancelling the %d request(s) in flight\n", srv->in_flight());
                srv->cancel_in_flight();
            }
        }
        if (drain.joinable()) drain.join();
    }

    sigset_t set_;
    std::atomic<bool> served_{false};
    std::atomic<server::Server*> srv_{nullptr};
    double timeout_s_ = 0;
    std::thread waiter_;
};

}  // namespace

void add_serve_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)");
    static ModelOptions eo;
    static SpecOptions spec;
    static std::string host = "127.0.0.1", alias, api_key, reasoning_format = "deepseek";
    static int port = 8080, parallel = 4, cache_ram = 2048, checkpoint_every = 1024;
    static double shutdown_timeout = 10;
    eo.add_to(cmd, false);
    spec.add_to(cmd);
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
    cmd->add_option("--shutdown-timeout", shutdown_timeout,
                    "on SIGTERM/SIGINT: seconds the requests in flight get to finish before they are cancelled")
        ->capture_default_str();
    cmd->callback([] {
        spec.validate();
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
        if (!(shutdown_timeout >= 0))
            throw Error("--shutdown-timeout must be >= 0 (seconds), got " + std::to_string(shutdown_timeout));
        SignalDrain signals;  // before the engine's and the server's threads exist
        EngineOptions e = eo.engine_options(parallel);
        e.cache_ram_mib = cache_ram;
        e.checkpoint_every = checkpoint_every;
        spec.apply(e);
        Engine engine(e);
        server::Server srv(engine, so);
        const int bound = srv.bind();
        signals.attach(srv, shutdown_timeout);
        std::fprintf(stderr, "alloy serve: %s on http://%s:%d (%d requests at once, context %d tokens each)\n",
                     so.model_name.c_str(), host.c_str(), bound, parallel, eo.ctx);
        srv.listen();
        signals.finish();
        std::fprintf(stderr, "alloy serve: stopped\n");
    });
}

}  // namespace alloy::cli
