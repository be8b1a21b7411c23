// alloy logits: fp32 logits of every position, row-major [n_tokens, n_vocab], little-endian.
// --dump NAME (repeatable; `--dump list` prints the names) also writes intermediate tensors of
// the forward, each to OUTPUT.NAME.f32 as [rows, cols] fp32 in position order, to diff against
// transformers' hidden states.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "alloy/engine.h"
#include "alloy/error.h"
#include "cli/common.h"

namespace alloy::cli {

void add_logits_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("logits", "write the logits of every position of a token sequence");
    static ModelOptions eo;
    static std::string ids_text, out;
    static bool decode = false;
    static int step = 0;
    static std::vector<std::string> dump;
    eo.add_to(cmd, true);
    cmd->add_option("--ids", ids_text, "token ids, space separated");
    cmd->add_option("-o,--output", out, "output file (.f32)");
    cmd->add_option("--dump", dump,
                    "also write intermediate tensor NAME (graph name, e.g. blk.3.attn.q_rope; NAME* for a prefix) to "
                    "OUTPUT.NAME.f32; 'list' prints the names");
    cmd->add_flag("--decode", decode, "feed tokens one at a time through the decode path (--step 1)");
    cmd->add_option("--step", step,
                    "feed N tokens per call through the serial path (speculative verification's calls; 1 = --decode)")
        ->check(CLI::Range(1, 1 << 20));
    cmd->callback([] {
        if (dump.size() == 1 && dump[0] == "list") {
            Engine engine(eo.engine_options(1));
            std::fputs(engine.describe_forward().c_str(), stdout);
            return;
        }
        if (ids_text.empty()) throw Error("--ids is required");
        if (out.empty()) throw Error("--output is required");
        const std::vector<int32_t> ids = parse_ids(ids_text);
        if (ids.empty()) throw Error("--ids: no token ids given");
        Engine engine(eo.engine_options(1));
        const int V = engine.n_vocab();
        std::vector<Engine::TensorDump> dumped;
        const std::vector<float> logits = engine.evaluate(ids, decode ? 1 : step, dump, dumped);
        for (const Engine::TensorDump& d : dumped) {
            const std::string path = out + "." + d.name + ".f32";
            std::ofstream t(path, std::ios::binary);
            t.write(reinterpret_cast<const char*>(d.data.data()), std::streamsize(d.data.size() * sizeof(float)));
            if (!t) throw Error(path + ": write failed");
            std::fprintf(stderr, "wrote %s [%zu, %lld] (positions %lld..%lld) to %s\n", d.name.c_str(), d.positions.size(),
                         (long long)d.cols, (long long)d.positions.front(), (long long)d.positions.back(), path.c_str());
        }
        std::ofstream f(out, std::ios::binary);
        if (!f) throw Error(out + ": cannot open for writing");
        f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
        if (!f) throw Error(out + ": write failed");
        std::fprintf(stderr, "wrote %zu x %d logits to %s\n", ids.size(), V, out.c_str());
    });
}

}  // namespace alloy::cli
