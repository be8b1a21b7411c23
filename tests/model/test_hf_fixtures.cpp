// End to end against the oracle: Hugging Face transformers' logits for random-init Qwen3.5
// configs (tests/fixtures, made by scripts/make_fixtures.py on the device machine). Each
// checkpoint goes through `convert` exactly as a user's would, then every position's logits
// must agree to < 1e-4 relative in prefill (serial and chunked GDN) and decode, and greedy
// continuations must be identical. transformers keeps K/V in fp32, so these tight checks run
// with an fp32 KV cache; the default f16 cache (llama.cpp's) is checked at its own tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "alloy/error.h"
#include "format/gguf.h"
#include "model/convert_qwen35.h"
#include "model/qwen35.h"
#include "runtime/model_runner.h"
#include "model/synth.h"
#include "runtime/sampler.h"
#include "tests/logits_error.h"

namespace alloy {
namespace {

namespace fs = std::filesystem;
const std::string kFixtures = std::string(ALLOY_SOURCE_DIR) + "/tests/fixtures/";

struct Fixture {
    nlohmann::json ref;
    std::unique_ptr<Qwen35Model> model;
    std::unique_ptr<ModelRunner> runner;  // the model's forward on the CPU backend
};

// Converts once per (fixture, dtype) and keeps the model for all tests.
Fixture& fixture(const std::string& name, GgmlType dtype = GgmlType::F32) {
    static std::map<std::pair<std::string, int>, Fixture> cache;
    auto key = std::make_pair(name, int(dtype));
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    const fs::path dir = fs::temp_directory_path() / ("alloy_fixture_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    ConvertOptions opt;
    opt.hf_dir = kFixtures + name;
    opt.out_path = (dir / (name + "_" + std::to_string(int(dtype)) + ".gguf")).string();
    opt.dtype = dtype;
    convert_hf_qwen35(opt);
    Fixture f;
    f.ref = nlohmann::json::parse(std::ifstream(kFixtures + name + "/reference.json"));
    f.model = Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(opt.out_path)));
    f.runner = std::make_unique<ModelRunner>(*f.model);
    fs::remove(opt.out_path);
    std::error_code ec;
    fs::remove(dir, ec);  // empty unless another fixture of this process is being written
    return cache.emplace(key, std::move(f)).first->second;
}

std::vector<float> read_f32(const std::string& path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    EXPECT_TRUE(in.good()) << path;
    std::vector<float> v(size_t(in.tellg()) / 4);
    in.seekg(0);
    in.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 4));
    return v;
}

using test::max_row_rel_error;

enum class Path { Serial, Chunked64, Chunked16, Decode };

constexpr KvCacheTypes kF32Cache{GgmlType::F32, GgmlType::F32};

std::vector<float> run_logits(const ModelRunner& m, const std::vector<int32_t>& ids, Path path,
                              KvCacheTypes kv = kF32Cache) {
    const size_t V = size_t(m.hparams().n_vocab);
    ModelState st = m.new_state(256, kv);
    std::vector<float> out(ids.size() * V);
    ForwardOptions fo;
    fo.all_logits = true;
    fo.gdn_mode = path == Path::Chunked64 || path == Path::Chunked16 ? ref::GdnMode::Chunked : ref::GdnMode::Serial;
    fo.gdn_chunk = path == Path::Chunked16 ? 16 : 64;
    if (path == Path::Decode) {
        for (size_t t = 0; t < ids.size(); ++t) m.forward(st, &ids[t], 1, fo, out.data() + t * V);
    } else {
        m.forward(st, ids.data(), int(ids.size()), fo, out.data());
    }
    return out;
}

class HfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixture, LogitsAgreeInEveryPath) {
    Fixture& f = fixture(GetParam());
    const size_t V = f.ref["vocab"].get<size_t>();
    ASSERT_EQ(size_t(f.model->hparams().n_vocab), V);
    for (const auto& seq : f.ref["sequences"]) {
        const auto ids = seq["ids"].get<std::vector<int32_t>>();
        const auto want = read_f32(kFixtures + GetParam() + "/" + seq["file"].get<std::string>());
        ASSERT_EQ(want.size(), ids.size() * V);
        for (Path p : {Path::Serial, Path::Chunked64, Path::Chunked16, Path::Decode}) {
            const double err = max_row_rel_error(run_logits(*f.runner, ids, p), want, V);
            EXPECT_LT(err, 1e-4) << GetParam() << " T=" << ids.size() << " path=" << int(p);
        }
    }
}

// The default f16 KV cache (llama.cpp's) against the same fp32 transformers logits. Measured
// worst relative error over the serial, chunked and decode paths: r1_tied 1.6e-4, r2_untied
// 1.2e-4, r3_deep_mtp 2.6e-4, vlm_r2 1.7e-4, i.e. about the f16 rounding of K and V
// (2^-11 = 4.9e-4 at most per element). 1e-3 leaves a ~4x margin over that measurement; the
// fp32-cache checks above keep the 1e-4 bound.
TEST_P(HfFixture, LogitsAgreeWithTheDefaultF16Cache) {
    Fixture& f = fixture(GetParam());
    const size_t V = f.ref["vocab"].get<size_t>();
    double worst = 0;
    for (const auto& seq : f.ref["sequences"]) {
        const auto ids = seq["ids"].get<std::vector<int32_t>>();
        const auto want = read_f32(kFixtures + GetParam() + "/" + seq["file"].get<std::string>());
        for (Path p : {Path::Serial, Path::Chunked64, Path::Decode}) {
            const double err = max_row_rel_error(run_logits(*f.runner, ids, p, KvCacheTypes{}), want, V);
            worst = std::max(worst, err);
            EXPECT_LT(err, 1e-3) << GetParam() << " T=" << ids.size() << " path=" << int(p);
        }
    }
    RecordProperty("worst_rel_err_f16_cache", std::to_string(worst));
}

// Speculative verification runs a few tokens per call through the serial arm and must
// reproduce what decode (one token per call) computes, bit for bit: every kernel on that path
// (matmul, GDN serial, kv_store, attention, norms) gives the same bits for 1..4 tokens per
// call. Checked with the default f16 KV cache and with an fp32 one. These F32 fixtures also
// run long prefills through kernels with the same sums when the cache is fp32: checked too.
// With an f16 cache, prefill attention takes its transposed path (kernels/cpu/
// attention_avx512.cpp), which sums each score in another order: close, not the same bits.
TEST_P(HfFixture, VerificationReproducesDecodeBitForBit) {
    Fixture& f = fixture(GetParam());
    const ModelRunner& m = *f.runner;
    const auto ids = f.ref["sequences"][1]["ids"].get<std::vector<int32_t>>();
    const size_t V = size_t(m.hparams().n_vocab);
    for (KvCacheTypes kv : {KvCacheTypes{}, kF32Cache}) {
        const char* cache = type_traits(kv.k).name;
        const std::vector<float> decode = run_logits(m, ids, Path::Decode, kv);
        for (int width : {2, 3, 4}) {
            ModelState st = m.new_state(256, kv);
            std::vector<float> out(ids.size() * V);
            ForwardOptions fo;
            fo.all_logits = true;
            fo.gdn_mode = ref::GdnMode::Serial;
            for (size_t t = 0; t < ids.size(); t += size_t(width)) {
                const int n = int(std::min(ids.size() - t, size_t(width)));
                m.forward(st, &ids[t], n, fo, out.data() + t * V);
            }
            EXPECT_EQ(out, decode) << "verification width " << width << ", " << cache << " cache";
        }
        if (kv.k == GgmlType::F32)
            EXPECT_EQ(run_logits(m, ids, Path::Serial, kv), decode) << cache << " cache";
        else
            EXPECT_LT(max_row_rel_error(run_logits(m, ids, Path::Serial, kv), decode, V), 1e-5) << cache << " cache";
    }
}

// Also with the default f16 cache: its 2-3e-4 logit error does not flip a greedy choice here.
TEST_P(HfFixture, GreedyContinuationIsIdentical) {
    Fixture& f = fixture(GetParam());
    const ModelRunner& m = *f.runner;
    for (KvCacheTypes kv : {kF32Cache, KvCacheTypes{}})
        for (const auto& g : f.ref["greedy"]) {
            const auto prompt = g["prompt"].get<std::vector<int32_t>>();
            const auto want = g["generated"].get<std::vector<int32_t>>();
            ModelState st = m.new_state(256, kv);
            std::vector<float> logits(size_t(m.hparams().n_vocab));
            Sampler greedy({.temp = 0});
            ForwardOptions fo;
            m.forward(st, prompt.data(), int(prompt.size()), fo, logits.data());
            fo.gdn_mode = ref::GdnMode::Serial;
            std::vector<int32_t> got;
            for (size_t i = 0; i < want.size(); ++i) {
                got.push_back(greedy.sample(logits.data(), m.hparams().n_vocab));
                m.forward(st, &got.back(), 1, fo, logits.data());
            }
            EXPECT_EQ(got, want) << GetParam() << ", " << type_traits(kv.k).name << " cache";
        }
}

// Every weight in the fixtures is bf16-exact (and f16-exact at these magnitudes). F16 files run
// with fp32 activations and must be as accurate as f32. BF16 files run the bf16 dot-product
// kernels, which round the activations to bf16 as llama.cpp does (2^-9 relative); these small
// random models amplify that to 4-13% of the logits, so BF16 only has to stay in that band (a
// wrong layout or scale gives errors of order 1). Q8_0 quantizes activations to 8 bits, which
// the same amplification turns into 13-40%; it is checked at the kernel level
// (tests/kernels/test_matmul.cpp) and against llama.cpp's perplexity (NOTES.md).
TEST_P(HfFixture, F16AndBf16Files) {
    for (auto [dtype, tol] : {std::pair{GgmlType::F16, 1e-4}, {GgmlType::BF16, 0.25}}) {
        Fixture& f = fixture(GetParam(), dtype);
        const size_t V = f.ref["vocab"].get<size_t>();
        const auto& seq = f.ref["sequences"][0];
        const auto ids = seq["ids"].get<std::vector<int32_t>>();
        const auto want = read_f32(kFixtures + GetParam() + "/" + seq["file"].get<std::string>());
        EXPECT_LT(max_row_rel_error(run_logits(*f.runner, ids, Path::Chunked64), want, V), tol)
            << GetParam() << " dtype " << int(dtype);
    }
}

INSTANTIATE_TEST_SUITE_P(Qwen35, HfFixture,
                         ::testing::Values("r1_tied", "r2_untied", "r3_deep_mtp", "vlm_r2", "moe_r2"));


// A prompt longer than the largest plan runs as consecutive pieces; the result must be the
// one-piece result (the states carry over exactly as in one call).
TEST(HfFixturePieces, PiecesEqualOneCall) {
    Fixture& f = fixture("r2_untied");
    const ModelRunner& m = *f.runner;
    const auto ids = f.ref["sequences"][1]["ids"].get<std::vector<int32_t>>();  // 80 tokens
    const size_t V = size_t(m.hparams().n_vocab);
    for (int chunk : {16, 64}) {
        ForwardOptions one, pieces;
        one.all_logits = pieces.all_logits = true;
        one.gdn_chunk = pieces.gdn_chunk = chunk;
        pieces.max_batch = chunk;  // 80 tokens -> 5 or 2 pieces
        std::vector<float> a(ids.size() * V), b(ids.size() * V);
        ModelState s1 = m.new_state(128), s2 = m.new_state(128);
        m.forward(s1, ids.data(), int(ids.size()), one, a.data());
        m.forward(s2, ids.data(), int(ids.size()), pieces, b.data());
        EXPECT_LT(max_row_rel_error(b, a, V), 1e-5) << chunk;
        EXPECT_EQ(s1.n_past, s2.n_past);
    }
}

// Only the last token's logits (the default): the last layer computes its queries, attention,
// output projection and MLP for the last row alone, and an inner piece of a long prompt stops
// that layer once its K/V rows are stored. Both must keep the oracle's logits: the prompt in
// one call and in pieces of 16 (inner pieces write the last layer's K/V and nothing after
// it), then one decode step, which reads the K/V the pruned prompt pass stored.
TEST_P(HfFixture, LastTokenLogitsSkipTheUnusedRows) {
    Fixture& f = fixture(GetParam());
    const ModelRunner& m = *f.runner;
    const size_t V = f.ref["vocab"].get<size_t>();
    for (const auto& seq : f.ref["sequences"]) {
        const auto ids = seq["ids"].get<std::vector<int32_t>>();
        const auto want = read_f32(kFixtures + GetParam() + "/" + seq["file"].get<std::string>());
        const size_t n = ids.size();
        ASSERT_GE(n, 3u);
        auto row = [&](size_t t) { return std::vector<float>(want.begin() + long(t * V), want.begin() + long((t + 1) * V)); };
        for (int piece : {0, 16}) {
            ForwardOptions fo;
            fo.gdn_chunk = 16;
            if (piece) fo.max_batch = piece;
            ModelState st = m.new_state(256, kF32Cache);
            std::vector<float> logits(V);
            m.forward(st, ids.data(), int(n - 1), fo, logits.data());
            EXPECT_LT(max_row_rel_error(logits, row(n - 2), V), 1e-4) << GetParam() << " T=" << n - 1 << " piece " << piece;
            m.forward(st, &ids[n - 1], 1, fo, logits.data());
            EXPECT_LT(max_row_rel_error(logits, row(n - 1), V), 1e-4) << GetParam() << " decode after T=" << n - 1;
        }
    }
}

// The same pruning when the last layer is a GDN one (the fixtures all end in attention):
// synthetic models of 3 and 5 layers. Their F16 weights run kernels that give the same bits
// for any token count, so the last-token path must reproduce the last row of the all-logits
// path exactly, in one call and in pieces, and so must the state it leaves for the next call.
TEST(LastTokenLogits, GdnLastLayerGivesTheAllRowsBits) {
    const fs::path dir = fs::temp_directory_path() / ("alloy_synth_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    for (int layers : {3, 5}) {
        SynthOptions so;
        so.dtype = GgmlType::F16;
        so.n_layer = layers;
        so.tokenizer_json = std::string(ALLOY_SOURCE_DIR) + "/testdata/qwen3-tokenizer/tokenizer.json";
        so.out_path = (dir / ("gdn_last_" + std::to_string(layers) + ".gguf")).string();
        synth_qwen35(so);
        auto model = Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(so.out_path)));
        auto m = std::make_unique<ModelRunner>(*model);
        fs::remove(so.out_path);
        ASSERT_TRUE(m->hparams().is_recurrent(layers - 1));
        const size_t V = size_t(m->hparams().n_vocab);
        std::mt19937 rng(11);
        std::vector<int32_t> ids(41);
        for (auto& id : ids) id = int32_t(rng() % 5000);
        const int n = int(ids.size()) - 1;  // the prompt; the last id is one decode step
        auto run = [&](bool all, int piece) {
            ForwardOptions fo;
            fo.all_logits = all;
            fo.gdn_chunk = 16;
            if (piece) fo.max_batch = piece;
            ModelState st = m->new_state(64, kF32Cache);
            std::vector<float> out(size_t(all ? n : 1) * V), next(V);
            m->forward(st, ids.data(), n, fo, out.data());
            fo.all_logits = false;
            m->forward(st, &ids[size_t(n)], 1, fo, next.data());
            out.erase(out.begin(), out.end() - long(V));  // the prompt's last row
            out.insert(out.end(), next.begin(), next.end());
            return out;
        };
        const std::vector<float> want = run(true, 0);
        for (int piece : {0, 16})
            EXPECT_EQ(run(false, piece), want) << layers << " layers, piece " << piece;
    }
    fs::remove_all(dir);
}

// Verification deep in the context: after a 250-token prompt, the next 12 tokens as calls of
// 2, 3 and 4 tokens give the bits of 12 decode steps, across the attention's 256-key grid
// boundary (kernels/cpu/attention.cpp), with both cache types.
TEST(HfFixtureDeep, VerificationReproducesDecodeAcrossKeyCells) {
    Fixture& f = fixture("r1_tied");
    const ModelRunner& m = *f.runner;
    const size_t V = size_t(m.hparams().n_vocab);
    std::mt19937 rng(5);
    std::vector<int32_t> ids(262);
    for (auto& id : ids) id = int32_t(rng() % uint32_t(V));
    for (KvCacheTypes kv : {KvCacheTypes{}, kF32Cache}) {
        auto run = [&](int width) {
            ModelState st = m.new_state(300, kv);
            ForwardOptions fo;
            fo.all_logits = true;
            std::vector<float> prompt(250 * V), out(12 * V);
            m.forward(st, ids.data(), 250, fo, prompt.data());
            fo.gdn_mode = ref::GdnMode::Serial;
            for (int t = 0; t < 12; t += width) m.forward(st, &ids[size_t(250 + t)], width, fo, out.data() + t * V);
            return out;
        };
        const std::vector<float> decode = run(1);
        for (int width : {2, 3, 4})
            EXPECT_EQ(run(width), decode) << "width " << width << ", " << type_traits(kv.k).name << " cache";
    }
}

// The graph's named tensors against transformers' residual stream (forward hooks on its modules:
// scripts/fixture_hidden_states.py): the embedding (h0), every layer's output (blk.N.h) and the
// final norm (hf), dumped through ForwardOptions::dump as alloy logits --dump does, on the
// serial, chunked and decode paths; and dumping changes no logit.
TEST(HfFixtureDump, ResidualStreamAgreesWithTransformersLayerByLayer) {
    for (const char* name : {"r2_untied", "r3_deep_mtp"}) {
        SCOPED_TRACE(name);
        Fixture& f = fixture(name);
        const ModelRunner& m = *f.runner;
        const auto& seq = f.ref["sequences"][0];
        const auto ids = seq["ids"].get<std::vector<int32_t>>();
        const auto names = seq["hidden"]["tensors"].get<std::vector<std::string>>();
        const std::vector<float> hidden = read_f32(kFixtures + name + "/" + seq["hidden"]["file"].get<std::string>());
        const size_t T = ids.size(), D = size_t(m.hparams().n_embd), V = size_t(m.hparams().n_vocab);
        ASSERT_EQ(names.size(), size_t(m.hparams().n_layer) + 2);
        ASSERT_EQ(hidden.size(), names.size() * T * D);
        for (Path path : {Path::Serial, Path::Chunked16, Path::Decode}) {
            SCOPED_TRACE(int(path));
            std::map<std::string, std::vector<float>> got;
            ForwardOptions fo;
            fo.all_logits = true;
            fo.gdn_mode = path == Path::Chunked16 ? ref::GdnMode::Chunked : ref::GdnMode::Serial;
            fo.gdn_chunk = 16;
            fo.dump = names;
            fo.dump_sink = [&](const std::string& n, int64_t pos, const float* rows, int64_t n_rows, int64_t cols) {
                ASSERT_EQ(size_t(cols), D) << n;
                ASSERT_EQ(size_t(pos) * D, got[n].size()) << n << ": rows out of order";
                got[n].insert(got[n].end(), rows, rows + n_rows * cols);
            };
            ModelState st = m.new_state(256, kF32Cache);
            std::vector<float> logits(T * V);
            if (path == Path::Decode) {
                for (size_t t = 0; t < T; ++t) m.forward(st, &ids[t], 1, fo, logits.data() + t * V);
            } else {
                m.forward(st, ids.data(), int(T), fo, logits.data());
            }
            for (size_t k = 0; k < names.size(); ++k) {
                const std::vector<float> want(hidden.begin() + long(k * T * D), hidden.begin() + long((k + 1) * T * D));
                ASSERT_EQ(got[names[k]].size(), T * D) << names[k];
                EXPECT_LT(max_row_rel_error(got[names[k]], want, D), 2e-5) << names[k];
            }
            EXPECT_EQ(logits, run_logits(m, ids, path == Path::Chunked16 ? Path::Chunked16 : path)) << "dumping changed the logits";
        }
    }
}

// The MTP head (r3_deep_mtp carries a random one: transformers ignores it, so no oracle here;
// tests/cli/default_model_test.py checks the trained one against its training script). Run alone
// on given hidden rows (a drafter's step: ForwardOptions::mtp_hidden, its own cache) with the
// trunk's dumped last-layer rows and the next tokens, it gives the bits of the head run after
// the trunk in one graph (GraphSpec::mtp); row t depends on rows <= t only.
TEST(HfFixtureMtp, HeadAloneOnTheTrunksRowsGivesTheChainedGraphsBits) {
    Fixture& f = fixture("r3_deep_mtp");
    const ModelRunner& m = *f.runner;
    ASSERT_NE(m.model().mtp(), nullptr);
    const auto ids = f.ref["sequences"][0]["ids"].get<std::vector<int32_t>>();
    const size_t T = ids.size(), D = size_t(m.hparams().n_embd), V = size_t(m.hparams().n_vocab);
    ASSERT_GE(T, 4u);
    const std::string last = "blk." + std::to_string(m.hparams().n_layer - 1) + ".h";
    std::vector<float> hidden, chained(T * V);
    ForwardOptions fo;
    fo.all_logits = true;
    fo.mtp = true;
    fo.dump = {last};
    fo.dump_sink = [&](const std::string&, int64_t, const float* rows, int64_t n_rows, int64_t cols) {
        hidden.insert(hidden.end(), rows, rows + n_rows * cols);
    };
    ModelState st = m.new_state(256, kF32Cache);
    add_mtp_cache(st, m.hparams());
    m.forward(st, ids.data(), int(T), fo, chained.data());
    ASSERT_EQ(hidden.size(), T * D);
    // Alone: h_t with token t + 1 (the last row: its own token, as the chained graph pairs it).
    std::vector<int32_t> next(ids.begin() + 1, ids.end());
    next.push_back(ids.back());
    ForwardOptions fa;
    fa.all_logits = true;
    fa.mtp_hidden = hidden.data();
    ModelState ms = new_mtp_state(m.hparams(), 256, kF32Cache);
    std::vector<float> alone(T * V);
    m.forward(ms, next.data(), int(T), fa, alone.data());
    EXPECT_EQ(alone, chained);
    // The first half alone: its rows are the same (causal), and not the trunk's logits.
    ModelState ms2 = new_mtp_state(m.hparams(), 256, kF32Cache);
    std::vector<float> half(T / 2 * V);
    m.forward(ms2, next.data(), int(T / 2), fa, half.data());
    for (size_t i = 0; i < half.size(); ++i) ASSERT_NEAR(half[i], alone[i], 1e-5f * (1 + std::fabs(alone[i]))) << i;
    EXPECT_NE(alone, run_logits(m, ids, Path::Chunked16));
    // The head on a state without its cache: refused by name.
    ModelState plain = m.new_state(256, kF32Cache);
    try {
        m.forward(plain, ids.data(), int(T), fo, chained.data());
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("MTP cache"), std::string::npos) << e.what();
    }
}

// Plans keep their scratch uninitialised and shared between plans; every kernel must mask the
// rows past the tokens of its call. With every scratch block filled with NaN, each path must
// give the bits it gives with clean scratch (odd lengths, so buckets have padding rows).
TEST(HfFixturePlans, ScratchPastTheRealTokensIsNeverRead) {
    Fixture& f = fixture("r2_untied");
    const ModelRunner& m = *f.runner;
    const auto ids = f.ref["sequences"][1]["ids"].get<std::vector<int32_t>>();
    const size_t V = size_t(m.hparams().n_vocab);
    // 37 tokens, then 9 more in a second call, then one decode step: the states carried from
    // one call to the next would carry any garbage read in the padding too.
    auto run = [&](ref::GdnMode mode, int chunk) {
        ModelState st = m.new_state(128);
        ForwardOptions fo;
        fo.all_logits = true;
        fo.gdn_mode = mode;
        fo.gdn_chunk = chunk;
        std::vector<float> out(47 * V);
        m.forward(st, ids.data(), 37, fo, out.data());
        m.forward(st, ids.data() + 37, 9, fo, out.data() + 37 * V);
        m.forward(st, ids.data() + 46, 1, fo, out.data() + 46 * V);
        return out;
    };
    for (auto [mode, chunk] : {std::pair{ref::GdnMode::Serial, 64}, {ref::GdnMode::Chunked, 64},
                               {ref::GdnMode::Chunked, 16}}) {
        m.drop_plans();
        const auto clean = run(mode, chunk);
        m.drop_plans();
        PlanArena::set_poison(true);
        const auto poisoned = run(mode, chunk);
        PlanArena::set_poison(false);
        m.drop_plans();
        EXPECT_EQ(0, std::memcmp(clean.data(), poisoned.data(), clean.size() * 4)) << int(mode) << " C=" << chunk;
    }
}


// The KV cache is sized for n_ctx rows but only the rows written so far are ever touched:
// a fresh state holds no resident KV pages, and after n tokens at most the pages of n rows
// (+ the partial page at each end) are resident, in f16 half the bytes of f32.
TEST(ModelStateMemory, UntouchedCacheRowsStayUnbacked) {
    Fixture& f = fixture("r2_untied");
    const ModelRunner& m = *f.runner;
    const Qwen35HParams& hp = m.hparams();
    const size_t row = size_t(hp.n_head_kv) * size_t(hp.head_dim);
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const int n_ctx = 1 << 16;
    for (KvCacheTypes kv : {KvCacheTypes{}, kF32Cache}) {
        ModelState st = m.new_state(n_ctx, kv);
        const size_t elem = kv.k == GgmlType::F16 ? 2 : 4;
        for (int l = 0; l < hp.n_layer; ++l) {
            if (hp.is_recurrent(l)) continue;
            EXPECT_EQ(st.k_cache[size_t(l)][0].bytes(), size_t(n_ctx) * row * elem);
            EXPECT_EQ(st.k_cache[size_t(l)][0].resident_bytes(), 0u);
            EXPECT_EQ(st.v_cache[size_t(l)][0].resident_bytes(), 0u);
        }
        const auto ids = f.ref["sequences"][1]["ids"].get<std::vector<int32_t>>();
        std::vector<float> logits(size_t(hp.n_vocab));
        m.forward(st, ids.data(), int(ids.size()), ForwardOptions{}, logits.data());
        const size_t used = ids.size() * row * elem;
        for (int l = 0; l < hp.n_layer; ++l) {
            if (hp.is_recurrent(l)) continue;
            for (const ZeroPages* c : {&st.k_cache[size_t(l)][0], &st.v_cache[size_t(l)][0]}) {
                EXPECT_GE(c->resident_bytes(), used);
                EXPECT_LE(c->resident_bytes(), (used + page - 1) / page * page);
            }
        }
    }
}

TEST(ModelStateMemory, RejectsOtherCacheTypes) {
    const ModelRunner& m = *fixture("r2_untied").runner;
    EXPECT_THROW(m.new_state(16, {GgmlType::Q8_0, GgmlType::F16}), Error);
    EXPECT_THROW(m.new_state(16, {GgmlType::F16, GgmlType::Q4_0}), Error);
}

}  // namespace
}  // namespace alloy

namespace alloy {
namespace {

// A broken qwen35moe file is refused with the key or tensor named: the converted moe_r2
// fixture rewritten with one edit each.
TEST(MoeFile, InconsistentFilesAreRefusedByName) {
    const fs::path dir = fs::temp_directory_path() / ("alloy_moe_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    ConvertOptions opt;
    opt.hf_dir = kFixtures + "moe_r2";
    opt.out_path = (dir / "moe.gguf").string();
    convert_hf_qwen35(opt);
    auto rewrite = [&](const std::function<void(gguf::Writer&, std::vector<gguf::TensorInfo>&)>& edit) {
        auto f = gguf::File::open(opt.out_path);
        gguf::Writer w;
        for (const auto& [k, v] : f->metadata()) w.set(k, v);
        std::vector<gguf::TensorInfo> tensors = f->tensors();
        edit(w, tensors);
        for (const auto& t : tensors) w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
        const std::string out = (dir / "edited.gguf").string();
        w.write(out);
        return out;
    };
    auto expect_error = [](const std::string& path, const std::string& needle) {
        try {
            Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(path)));
            ADD_FAILURE() << "loaded a file that should fail with '" << needle << "'";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    auto model = Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(opt.out_path)));
    EXPECT_EQ(model->hparams().arch(), "qwen35moe");
    EXPECT_EQ(model->hparams().n_expert, 6);
    EXPECT_EQ(model->hparams().n_expert_used, 2);
    expect_error(rewrite([](gguf::Writer& w, auto&) { w.set("qwen35moe.expert_used_count", gguf::Value::u32(7)); }),
                 "qwen35moe.expert_used_count");
    expect_error(rewrite([](gguf::Writer& w, auto&) { w.set("qwen35moe.expert_feed_forward_length", gguf::Value::u32(40)); }),
                 "blk.0.ffn_gate_exps.weight");
    expect_error(rewrite([](gguf::Writer&, std::vector<gguf::TensorInfo>& t) {
                     std::erase_if(t, [](const auto& x) { return x.name == "blk.2.ffn_down_exps.weight"; });
                 }),
                 "blk.2.ffn_down_exps.weight");
    expect_error(rewrite([](gguf::Writer&, std::vector<gguf::TensorInfo>& t) {
                     std::erase_if(t, [](const auto& x) { return x.name == "blk.1.ffn_gate_inp_shexp.weight"; });
                 }),
                 "blk.1.ffn_gate_inp_shexp.weight");
    fs::remove_all(dir);
}

}  // namespace
}  // namespace alloy
