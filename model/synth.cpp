#include "model/synth.h"

#include "alloy/synth.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "alloy/error.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

namespace alloy {
namespace {

struct Preset {
    int D, n_layer, n_ff, n_head, n_head_kv, head_dim, H_k, H_v, d, n_vocab;  // n_vocab 0: from tokenizer
    bool tied;
    int n_expert = 0, n_used = 0, n_ff_exp = 0, n_ff_shexp = 0;  // MoE (qwen35moe) when n_expert > 0
};

// Shapes from spec/MODEL.md section 9.
const std::map<std::string, Preset>& presets() {
    static const std::map<std::string, Preset> p = {
        {"tiny", {256, 4, 512, 4, 2, 64, 2, 4, 64, 0, true}},
        {"0.8b", {1024, 24, 3584, 8, 2, 256, 16, 16, 128, 248320, true}},
        {"2b", {2048, 24, 6144, 8, 2, 256, 16, 16, 128, 248320, true}},
        {"4b", {2560, 32, 9216, 16, 4, 256, 16, 32, 128, 248320, true}},
        {"9b", {4096, 32, 12288, 16, 4, 256, 16, 32, 128, 248320, false}},
        {"27b", {5120, 64, 17408, 24, 4, 256, 16, 48, 128, 248320, false}},
        // MoE: every FFN 256 routed experts (8 per token, width 512) and a shared one.
        {"35b-a3b", {2048, 40, 0, 16, 2, 256, 16, 32, 128, 248320, false, 256, 8, 512, 512}},
        {"moe-tiny", {256, 4, 0, 4, 2, 64, 2, 4, 64, 0, false, 8, 2, 128, 128}},
        // tiny with one KV head: tensor parallelism replicates it (tests/runtime/test_tensor_parallel.cpp).
        {"tiny-mqa", {256, 4, 512, 4, 1, 64, 2, 4, 64, 0, true}},
    };
    return p;
}

// Fast deterministic normals: splitmix64 + Box-Muller (std::normal_distribution is slow at 1e9 draws).
struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
    // v[i] for i in [begin, end) (begin even) of a stream whose pair i / 2 takes draws i and
    // i + 1 after the state `base`: the draws are a counter (s += golden), so any range can be
    // computed on its own and every split gives the same values.
    static void normals_range(uint64_t base, float* v, size_t begin, size_t end, size_t n, float mean, float std) {
        Rng r{base + uint64_t(begin) * 0x9e3779b97f4a7c15ull};
        for (size_t i = begin; i < end; i += 2) {
            const double u1 = std::max(r.uniform(), 1e-300), u2 = r.uniform();
            const double rad = std::sqrt(-2.0 * std::log(u1));
            v[i] = mean + std * float(rad * std::cos(6.283185307179586 * u2));
            if (i + 1 < n) v[i + 1] = mean + std * float(rad * std::sin(6.283185307179586 * u2));
        }
    }
    // Box-Muller pairs over v, on every core for big tensors (the 27b preset draws 2.7e10
    // values); the values do not depend on the thread count.
    void normals(std::vector<float>& v, float mean, float std) {
        const size_t n = v.size(), pairs = (n + 1) / 2;
        const size_t threads = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), pairs / (1 << 20) + 1);
        const size_t per = (pairs + threads - 1) / threads * 2;  // elements per thread, even
        std::vector<std::thread> pool;
        for (size_t t = 1; t < threads; ++t)
            pool.emplace_back(normals_range, s, v.data(), std::min(n, t * per), std::min(n, (t + 1) * per), n, mean, std);
        normals_range(s, v.data(), 0, std::min(n, per), n, mean, std);
        for (std::thread& th : pool) th.join();
        s += uint64_t(pairs * 2) * 0x9e3779b97f4a7c15ull;
    }
};

}  // namespace

std::string synth_qwen35(const SynthOptions& opt) {
    auto it = presets().find(opt.preset);
    if (it == presets().end())
        throw Error("synth: unknown --preset '" + opt.preset + "' (tiny, tiny-mqa, 0.8b, 2b, 4b, 9b, 27b, moe-tiny, 35b-a3b)");
    if (opt.n_layer < 0 || opt.n_layer > 1024)
        throw Error("synth: --layers " + std::to_string(opt.n_layer) + " is outside [1, 1024]");
    Preset P = it->second;
    if (opt.n_layer > 0) P.n_layer = opt.n_layer;
    Vocab vocab = opt.tokenizer_json.empty() ? qwen35_default_vocab() : Tokenizer::from_path(opt.tokenizer_json).vocab();
    int n_vocab = P.n_vocab ? P.n_vocab : int((vocab.tokens.size() + 127) / 128 * 128);
    pad_vocab(vocab, size_t(n_vocab), "synth --preset " + opt.preset);

    gguf::Writer w;
    const bool moe = P.n_expert > 0;
    const std::string arch = moe ? "qwen35moe" : "qwen35", A = arch + ".";
    const int vd = P.H_v * P.d, conv_dim = 2 * P.H_k * P.d + vd, K = 4;
    w.set("general.architecture", gguf::Value::str(arch));
    w.set("general.name", gguf::Value::str("alloy-synth-" + opt.preset));
    w.set("general.file_type", gguf::Value::u32(opt.dtype == GgmlType::Q8_0 ? 7 : opt.dtype == GgmlType::BF16 ? 32
                                                : opt.dtype == GgmlType::F16 ? 1 : 0));
    w.set(A + "context_length", gguf::Value::u32(262144));
    w.set(A + "embedding_length", gguf::Value::u32(uint32_t(P.D)));
    w.set(A + "block_count", gguf::Value::u32(uint32_t(P.n_layer + (opt.mtp ? 1 : 0))));
    if (opt.mtp) w.set(A + "nextn_predict_layers", gguf::Value::u32(1));
    if (moe) {
        w.set(A + "expert_count", gguf::Value::u32(uint32_t(P.n_expert)));
        w.set(A + "expert_used_count", gguf::Value::u32(uint32_t(P.n_used)));
        w.set(A + "expert_feed_forward_length", gguf::Value::u32(uint32_t(P.n_ff_exp)));
        w.set(A + "expert_shared_feed_forward_length", gguf::Value::u32(uint32_t(P.n_ff_shexp)));
    } else {
        w.set(A + "feed_forward_length", gguf::Value::u32(uint32_t(P.n_ff)));
    }
    w.set(A + "attention.head_count", gguf::Value::u32(uint32_t(P.n_head)));
    w.set(A + "attention.head_count_kv", gguf::Value::u32(uint32_t(P.n_head_kv)));
    w.set(A + "attention.key_length", gguf::Value::u32(uint32_t(P.head_dim)));
    w.set(A + "attention.value_length", gguf::Value::u32(uint32_t(P.head_dim)));
    w.set(A + "attention.layer_norm_rms_epsilon", gguf::Value::f32(1e-6f));
    w.set(A + "rope.freq_base", gguf::Value::f32(1e7f));
    w.set(A + "rope.dimension_count", gguf::Value::u32(uint32_t(P.head_dim / 4)));
    w.set(A + "rope.dimension_sections", gguf::Value::i32_array({11, 11, 10, 0}));
    w.set(A + "full_attention_interval", gguf::Value::u32(4));
    w.set(A + "ssm.conv_kernel", gguf::Value::u32(uint32_t(K)));
    w.set(A + "ssm.state_size", gguf::Value::u32(uint32_t(P.d)));
    w.set(A + "ssm.group_count", gguf::Value::u32(uint32_t(P.H_k)));
    w.set(A + "ssm.time_step_rank", gguf::Value::u32(uint32_t(P.H_v)));
    w.set(A + "ssm.inner_size", gguf::Value::u32(uint32_t(vd)));
    add_vocab_to_gguf(vocab, w);

    // Tensors are declared here and drawn when the writer reaches them, one at a time and in
    // this order (so the random stream, and the file, are those of drawing them all up front),
    // so a preset bigger than memory (27b) is written with one tensor's values in memory.
    Rng rng{opt.seed};
    std::vector<float> buf;
    struct Draw {
        GgmlType type;
        std::vector<int64_t> ne;
        std::function<void(std::vector<float>&)> fill;  // resizes and fills the values
    };
    std::vector<Draw> draws;
    auto declare = [&](const std::string& name, GgmlType type, std::vector<int64_t> ne,
                       std::function<void(std::vector<float>&)> fill) {
        w.declare_tensor(name, type, ne);
        draws.push_back({type, std::move(ne), std::move(fill)});
    };
    // A matrix, or with n_expert > 0 one per expert stacked (ne {n_in, n_out, n_expert}).
    auto matrix = [&](const std::string& name, int64_t n_in, int64_t n_out, int64_t n_expert = 0,
                      std::optional<GgmlType> type = std::nullopt) {
        const int64_t n = std::max<int64_t>(1, n_expert);
        std::vector<int64_t> ne{n_in, n_out};
        if (n_expert) ne.push_back(n_expert);
        declare(name, type.value_or(opt.dtype), ne, [&rng, n = size_t(n_in * n_out * n)](std::vector<float>& v) {
            v.resize(n);
            rng.normals(v, 0.0f, 0.02f);
        });
    };
    auto vec = [&](const std::string& name, std::vector<int64_t> ne, std::function<float()> gen) {
        int64_t n = 1;
        for (auto e : ne) n *= e;
        declare(name, GgmlType::F32, ne, [n, gen](std::vector<float>& v) {
            v.resize(size_t(n));
            for (auto& x : v) x = gen();
        });
    };
    auto norm = [&](const std::string& name, int64_t n) {
        declare(name, GgmlType::F32, {n}, [&rng, n](std::vector<float>& v) {
            v.resize(size_t(n));
            rng.normals(v, 1.0f, 0.02f);
        });
    };

    matrix("token_embd.weight", P.D, n_vocab);
    norm("output_norm.weight", P.D);
    if (!P.tied) matrix("output.weight", P.D, n_vocab);
    auto layer = [&](int l, bool attention) {
        const std::string p = "blk." + std::to_string(l) + ".";
        norm(p + "attn_norm.weight", P.D);
        norm(p + "post_attention_norm.weight", P.D);
        if (moe) {  // router and shared-expert gate in F32, as llama.cpp's converter keeps them
            matrix(p + "ffn_gate_inp.weight", P.D, P.n_expert, 0, GgmlType::F32);
            matrix(p + "ffn_gate_exps.weight", P.D, P.n_ff_exp, P.n_expert);
            matrix(p + "ffn_up_exps.weight", P.D, P.n_ff_exp, P.n_expert);
            matrix(p + "ffn_down_exps.weight", P.n_ff_exp, P.D, P.n_expert);
            matrix(p + "ffn_gate_inp_shexp.weight", P.D, 1, 0, GgmlType::F32);
            matrix(p + "ffn_gate_shexp.weight", P.D, P.n_ff_shexp);
            matrix(p + "ffn_up_shexp.weight", P.D, P.n_ff_shexp);
            matrix(p + "ffn_down_shexp.weight", P.n_ff_shexp, P.D);
        } else {
            matrix(p + "ffn_gate.weight", P.D, P.n_ff);
            matrix(p + "ffn_up.weight", P.D, P.n_ff);
            matrix(p + "ffn_down.weight", P.n_ff, P.D);
        }
        if (attention) {
            matrix(p + "attn_q.weight", P.D, 2 * P.n_head * P.head_dim);
            matrix(p + "attn_k.weight", P.D, P.n_head_kv * P.head_dim);
            matrix(p + "attn_v.weight", P.D, P.n_head_kv * P.head_dim);
            matrix(p + "attn_output.weight", P.n_head * P.head_dim, P.D);
            norm(p + "attn_q_norm.weight", P.head_dim);
            norm(p + "attn_k_norm.weight", P.head_dim);
        } else {
            matrix(p + "attn_qkv.weight", P.D, conv_dim);
            matrix(p + "attn_gate.weight", P.D, vd);
            matrix(p + "ssm_beta.weight", P.D, P.H_v);
            matrix(p + "ssm_alpha.weight", P.D, P.H_v);
            vec(p + "ssm_conv1d.weight", {K, conv_dim}, [&] { return float(rng.uniform() - 0.5); });
            vec(p + "ssm_a", {P.H_v}, [&] { return -float(1.0 + 15.0 * rng.uniform()); });
            vec(p + "ssm_dt.bias", {P.H_v}, [&] {
                const double dt = std::exp(std::log(1e-3) + rng.uniform() * (std::log(1e-1) - std::log(1e-3)));
                return float(dt + std::log(-std::expm1(-dt)));  // softplus^-1(dt)
            });
            norm(p + "ssm_norm.weight", P.d);
            matrix(p + "ssm_out.weight", vd, P.D);
        }
    };
    for (int l = 0; l < P.n_layer; ++l) layer(l, (l + 1) % 4 == 0);
    // The MTP block after the trunk, as llama.cpp's converter writes it (blk.{n_layer}: an
    // attention layer and its nextn.* tensors); drawn last, so the trunk's values are those of
    // a file without it.
    if (opt.mtp) {
        layer(P.n_layer, true);
        const std::string p = "blk." + std::to_string(P.n_layer) + ".";
        matrix(p + "nextn.eh_proj.weight", 2 * P.D, P.D);
        norm(p + "nextn.enorm.weight", P.D);
        norm(p + "nextn.hnorm.weight", P.D);
        norm(p + "nextn.shared_head_norm.weight", P.D);
    }
    w.write(opt.out_path, [&](size_t i, std::vector<uint8_t>& out) {
        const Draw& d = draws[i];
        d.fill(buf);
        gguf::Writer::encode_f32(d.type, d.ne, buf.data(), out);
    });
    return "wrote " + opt.out_path + " (preset " + opt.preset + ", " + std::to_string(P.n_layer) +
           " layers" + (opt.mtp ? " + an MTP block" : "") + ", vocab " + std::to_string(n_vocab) + ")";
}

GgmlType matrix_dtype(const std::string& name, const std::string& what) {
    if (name == "f32") return GgmlType::F32;
    if (name == "f16") return GgmlType::F16;
    if (name == "bf16") return GgmlType::BF16;
    if (name == "q8_0") return GgmlType::Q8_0;
    throw Error(what + " must be f32, f16, bf16 or q8_0, got '" + name + "'");
}

std::string synth_model(const SynthRequest& r) {
    SynthOptions opt;
    opt.preset = r.preset;
    opt.dtype = matrix_dtype(r.dtype, "synth: --dtype");
    opt.tokenizer_json = r.tokenizer_json;  // empty: the built-in Qwen3.5 vocabulary
    opt.out_path = r.out_path;
    opt.seed = r.seed;
    opt.n_layer = r.n_layer;
    opt.mtp = r.mtp;
    return synth_qwen35(opt);
}

}  // namespace alloy
