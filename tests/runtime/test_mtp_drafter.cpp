// The MTP head as a drafter (runtime/mtp_drafter.h) on the trained default model, whose head was
// trained beside it (testdata/default-model): greedy decode with its drafts verified by
// verify_greedy gives plain greedy decode's tokens and logits bit for bit, and the head's drafts
// are accepted about as often as its teacher-forced agreement (0.54 in the training script)
// says, far above what a wrong pairing of rows, tokens or positions would give.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "alloy/error.h"
#include "alloy/quantize.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "model/qwen35.h"
#include "runtime/model_runner.h"
#include "runtime/mtp_drafter.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"

namespace alloy {
namespace {

namespace fs = std::filesystem;

struct DefaultModel {
    std::unique_ptr<Qwen35Model> model;
    std::unique_ptr<ModelRunner> runner;
};

// The build unpacks the default model into share/alloy beside the binaries.
const DefaultModel& default_model() {
    static DefaultModel d = [] {
        const fs::path p = fs::path(ALLOY_BINARY).parent_path() / "share" / "alloy" / "alloy-default-kjv.gguf";
        if (!fs::exists(p)) throw Error(p.string() + ": not unpacked by the build");
        DefaultModel m;
        m.model = Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(p.string())));
        m.runner = std::make_unique<ModelRunner>(*m.model);
        return m;
    }();
    return d;
}

std::vector<std::vector<int32_t>> reference_prompts() {
    std::ifstream in(std::string(ALLOY_SOURCE_DIR) + "/testdata/default-model/reference.json");
    const auto j = nlohmann::json::parse(in);
    return j["prompts"].get<std::vector<std::vector<int32_t>>>();
}

// The default model quantized to IQ4_XS (as a user's llama-quantize would: 256-value blocks
// with D = 128, so nextn.eh_proj's blocks straddle its two input halves) still loads, its
// head's halves being each row's exact values in F32, and the head drafts.
TEST(MtpDrafter, HeadWhoseBlocksStraddleTheHalvesLoadsAsItsValues) {
    const fs::path src = fs::path(ALLOY_BINARY).parent_path() / "share" / "alloy" / "alloy-default-kjv.gguf";
    const fs::path out = fs::temp_directory_path() / ("alloy_mtp_iq4xs_" + std::to_string(::getpid()) + ".gguf");
    QuantizeRequest q;
    q.input = src.string();
    q.output = out.string();
    q.type = "IQ4_XS";
    q.allow_requantize = true;
    quantize_model(q);
    auto file = std::shared_ptr<gguf::File>(gguf::File::open(out.string()));
    const gguf::TensorInfo* eh = file->find_tensor("blk." + std::to_string(default_model().model->hparams().n_layer) +
                                                   ".nextn.eh_proj.weight");
    ASSERT_NE(eh, nullptr);
    const int64_t D = eh->ne[1];
    ASSERT_NE(D % type_traits(eh->type).block_elems, 0) << "the case needs blocks that straddle; got " << type_traits(eh->type).name;
    const auto model = Qwen35Model::load(file);
    fs::remove(out);
    const Qwen35Mtp* mtp = model->mtp();
    ASSERT_NE(mtp, nullptr);
    ASSERT_EQ(mtp->eh_e.type, GgmlType::F32);
    ASSERT_EQ(mtp->eh_h.type, GgmlType::F32);
    const size_t row = eh->nbytes / size_t(D);
    std::vector<float> v(size_t(2 * D));
    for (int64_t r = 0; r < D; ++r) {
        dequantize_row(eh->type, eh->data + size_t(r) * row, v.data(), 2 * D);
        ASSERT_EQ(0, std::memcmp(mtp->eh_e.row(r), v.data(), size_t(D) * 4)) << "row " << r << ", e half";
        ASSERT_EQ(0, std::memcmp(mtp->eh_h.row(r), v.data() + D, size_t(D) * 4)) << "row " << r << ", h half";
    }
    // It drafts: rows of the trunk in, tokens of the vocabulary out.
    const ModelRunner m(*model);
    MtpDrafter drafter(m, 256);
    const std::vector<int32_t> prompt = reference_prompts().front();
    std::vector<float> rows, logits(size_t(m.hparams().n_vocab));
    ForwardOptions fo;
    fo.dump = {drafter.trunk_rows_name()};
    fo.dump_sink = [&](const std::string&, int64_t, const float* r, int64_t n, int64_t cols) { rows.assign(r + (n - 1) * cols, r + n * cols); };
    ModelState st = m.new_state(256);
    m.forward(st, prompt.data(), int(prompt.size()), fo, logits.data());
    const int32_t next = greedy_token(logits.data(), m.hparams().n_vocab);
    drafter.observe(int(prompt.size()) - 1, rows.data(), &next, 1);
    const std::vector<int32_t> d = drafter.draft(2);
    ASSERT_FALSE(d.empty());
    for (int32_t t : d) EXPECT_TRUE(t >= 0 && t < m.hparams().n_vocab) << t;
}

TEST(MtpDrafter, VerifiedDraftsArePlainGreedyDecodeAndMostlyAccepted) {
    const ModelRunner& m = default_model().runner.operator*();
    const int V = m.hparams().n_vocab;
    const size_t D = size_t(m.hparams().n_embd);
    const int n_gen = 40;
    long drafted = 0, accepted = 0, first_drafted = 0, first_accepted = 0;
    for (const std::vector<int32_t>& prompt : reference_prompts()) {
        SCOPED_TRACE("prompt of " + std::to_string(prompt.size()) + " tokens");
        // Plain greedy decode.
        std::vector<int32_t> plain;
        std::vector<float> plain_logits(size_t(n_gen + 1) * V);
        {
            ModelState st = m.new_state(512);
            ForwardOptions fo;
            m.forward(st, prompt.data(), int(prompt.size()), fo, plain_logits.data());
            fo.gdn_mode = ref::GdnMode::Serial;
            for (int i = 0; i < n_gen; ++i) {
                plain.push_back(greedy_token(plain_logits.data() + size_t(i) * V, V));
                m.forward(st, &plain.back(), 1, fo, plain_logits.data() + size_t(i + 1) * V);
            }
        }
        // With the MTP head's drafts: the trunk's rows by position (a rollback's re-run gives the
        // same bits again), the prompt's rows first.
        MtpDrafter drafter(m, 512);
        std::map<int64_t, std::vector<float>> rows;
        ForwardOptions fo;
        fo.dump = {drafter.trunk_rows_name()};
        fo.dump_sink = [&](const std::string&, int64_t pos, const float* r, int64_t n, int64_t cols) {
            for (int64_t i = 0; i < n; ++i) rows[pos + i].assign(r + i * cols, r + (i + 1) * cols);
        };
        SlotStateCache cache(m, 1, 512);
        fo.all_logits = true;  // every prompt row's trunk output (the head's cache needs them all)
        std::vector<float> first(prompt.size() * size_t(V));
        m.forward(cache.state(), prompt.data(), int(prompt.size()), fo, first.data());
        fo.all_logits = false;
        std::vector<int32_t> got = {greedy_token(first.data() + (prompt.size() - 1) * V, V)};
        ASSERT_EQ(0, std::memcmp(first.data() + (prompt.size() - 1) * V, plain_logits.data(), size_t(V) * 4));
        auto observe = [&](int pos0, const std::vector<int32_t>& next) {
            std::vector<float> h;
            for (size_t i = 0; i < next.size(); ++i) {
                ASSERT_EQ(rows.count(pos0 + int64_t(i)), 1u) << "no trunk row at " << pos0 + i;
                h.insert(h.end(), rows[pos0 + int64_t(i)].begin(), rows[pos0 + int64_t(i)].end());
            }
            ASSERT_EQ(h.size(), next.size() * D);
            drafter.observe(pos0, h.data(), next.data(), int(next.size()));
        };
        std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
        next.push_back(got[0]);
        observe(0, next);
        while (int(got.size()) < n_gen) {
            const int k = std::min(3, n_gen - int(got.size()));
            const std::vector<int32_t> drafts = drafter.draft(k);
            ASSERT_EQ(drafts, drafter.draft(k)) << "drafting changed the drafter";
            const int pos0 = cache.n_past(0);  // got.back()'s position
            const VerifyResult r = verify_greedy(m, cache, 0, got.back(), drafts, fo);
            drafted += long(drafts.size());
            accepted += r.accepted;
            first_drafted += !drafts.empty();
            first_accepted += r.accepted > 0;
            for (size_t i = 0; i < r.tokens.size(); ++i) {
                const size_t at = got.size() + i;  // plain[at] follows got's token at - 1
                ASSERT_LT(at, plain.size() + 1);
                if (at >= plain.size()) break;
                ASSERT_EQ(r.tokens[i], plain[at]) << "token " << at;
                ASSERT_EQ(0, std::memcmp(r.logits.data() + i * size_t(V), plain_logits.data() + at * size_t(V), size_t(V) * 4))
                    << "logits of token " << at;
            }
            // The kept positions' rows: got.back() at pos0, then the kept drafts; each followed by
            // the verification's token after it.
            observe(pos0, r.tokens);
            got.insert(got.end(), r.tokens.begin(), r.tokens.end());
        }
    }
    const double rate = double(accepted) / double(drafted), first_rate = double(first_accepted) / double(first_drafted);
    std::printf("MTP drafts (K = 3, %ld drafted): %.3f accepted; first draft %.3f (%ld steps)\n", drafted, rate, first_rate,
                first_drafted);
    EXPECT_GT(first_rate, 0.35);
}

}  // namespace
}  // namespace alloy
