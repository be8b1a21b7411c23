// alloy logits: fp32 logits of every position, row-major [n_tokens, n_vocab], little-endian.
#include <cstdio>
#include <fstream>

#include "alloy/engine.h"
#include "alloy/error.h"
#include "cli/common.h"

namespace alloy::cli {

void add_logits_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("logits", "write the logits of every position of a token sequence");
    static ModelOptions eo;
    static std::string ids_text, out;
    static bool decode = false;
    eo.add_to(cmd, true);
    cmd->add_option("--ids", ids_text, "token ids, space separated")->required();
    cmd->add_option("-o,--output", out, "output file (.f32)")->required();
    cmd->add_flag("--decode", decode, "feed tokens one at a time through the decode path");
    cmd->callback([] {
        const std::vector<int32_t> ids = parse_ids(ids_text);
        if (ids.empty()) throw Error("--ids: no token ids given");
        Engine engine(eo.engine_options(1));
        const int V = engine.n_vocab();
        const std::vector<float> logits = engine.evaluate(ids, decode);
        std::ofstream f(out, std::ios::binary);
        if (!f) throw Error(out + ": cannot open for writing");
        f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
        if (!f) throw Error(out + ": write failed");
        std::fprintf(stderr, "wrote %zu x %d logits to %s\n", ids.size(), V, out.c_str());
    });
}

}  // namespace alloy::cli
