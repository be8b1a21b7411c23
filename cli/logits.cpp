// alloy logits: fp32 logits of every position, row-major [n_tokens, n_vocab], little-endian.
#include <cstdio>
#include <fstream>

#include "alloy/error.h"
#include "cli/common.h"
#include "runtime/loaded_model.h"

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
        ForwardOptions fo = eo.forward_options();
        const std::vector<int32_t> ids = parse_ids(ids_text);
        if (ids.empty()) throw Error("--ids: no token ids given");
        LoadedModel lm = load_model(eo.model_path(), eo.tensor_data());
        const int V = lm.model->hparams().n_vocab;
        ModelState st = lm.model->new_state(eo.ctx, eo.kv_types());
        std::vector<float> logits(ids.size() * size_t(V));
        if (decode) {
            fo.all_logits = false;
            fo.gdn_mode = ref::GdnMode::Serial;  // decode is the serial kernel by construction
            for (size_t t = 0; t < ids.size(); ++t)
                lm.model->forward(st, &ids[t], 1, fo, logits.data() + t * size_t(V));
        } else {
            fo.all_logits = true;
            lm.model->forward(st, ids.data(), int(ids.size()), fo, logits.data());
        }
        std::ofstream f(out, std::ios::binary);
        if (!f) throw Error(out + ": cannot open for writing");
        f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
        if (!f) throw Error(out + ": write failed");
        std::fprintf(stderr, "wrote %zu x %d logits to %s\n", ids.size(), V, out.c_str());
    });
}

}  // namespace alloy::cli
