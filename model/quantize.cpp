// llama-quantize's choice of tensor types (llama.cpp src/llama-quant.cpp, restated for the
// file types alloy writes) and the file rewrite. The per-layer rules count tensors in the
// order llama.cpp's loader sorts them (layer number, then name), so the counters here run
// in that order too.
#include "model/quantize.h"

#include "alloy/quantize.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <thread>

#include "alloy/error.h"
#include "format/gguf.h"
#include "format/quant.h"

namespace alloy {

namespace {

struct FileTypeInfo {
    FileType type;
    const char* name;
    GgmlType base;  // llama_ftype_get_default_type
};

constexpr FileTypeInfo kFileTypes[] = {
    {FileType::F32, "F32", GgmlType::F32},          {FileType::F16, "F16", GgmlType::F16},
    {FileType::BF16, "BF16", GgmlType::BF16},       {FileType::Q8_0, "Q8_0", GgmlType::Q8_0},
    {FileType::Q4_0, "Q4_0", GgmlType::Q4_0},       {FileType::Q4_K_S, "Q4_K_S", GgmlType::Q4_K},
    {FileType::Q4_K_M, "Q4_K_M", GgmlType::Q4_K},   {FileType::Q5_K_S, "Q5_K_S", GgmlType::Q5_K},
    {FileType::Q5_K_M, "Q5_K_M", GgmlType::Q5_K},   {FileType::Q6_K, "Q6_K", GgmlType::Q6_K},
    {FileType::IQ4_NL, "IQ4_NL", GgmlType::IQ4_NL}, {FileType::IQ4_XS, "IQ4_XS", GgmlType::IQ4_XS},
    {FileType::MXFP4_MOE, "MXFP4_MOE", GgmlType::MXFP4},
};

const FileTypeInfo& info(FileType t) {
    for (const FileTypeInfo& i : kFileTypes) {
        if (i.type == t) return i;
    }
    throw Error("file type #" + std::to_string(static_cast<uint32_t>(t)) + " is not one alloy writes");
}

bool is_block_quantized(GgmlType t) { return t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16; }

// llama-quantize's broad tensor categories (tensor_get_category), tested in its order.
enum class Category { Output, TokenEmbd, AttnQkv, AttnKvB, AttnV, AttnK, AttnQ, AttnOutput, FfnUp, FfnGate, FfnDown, Other };

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

Category category_of(const std::string& n) {
    if (n == "output.weight") return Category::Output;
    if (n == "token_embd.weight" || n == "per_layer_token_embd.weight") return Category::TokenEmbd;
    if (has(n, "attn_qkv.weight")) return Category::AttnQkv;
    if (has(n, "attn_kv_b.weight")) return Category::AttnKvB;
    if (has(n, "attn_v.weight")) return Category::AttnV;
    if (has(n, "attn_k.weight")) return Category::AttnK;
    if (has(n, "attn_q.weight")) return Category::AttnQ;
    if (has(n, "attn_output.weight")) return Category::AttnOutput;
    if (has(n, "ffn_up")) return Category::FfnUp;
    if (has(n, "ffn_gate")) return Category::FfnGate;
    if (has(n, "ffn_down")) return Category::FfnDown;
    return Category::Other;
}

// The value-projection-like tensors that llama-quantize gives more bits (its attn_qkv rule is
// unreachable behind this one, so a GDN layer's fused attn_qkv follows the attn_v rules).
bool attn_v_like(Category c) { return c == Category::AttnQkv || c == Category::AttnKvB || c == Category::AttnV; }

// ggml_n_dims: trailing dimensions of 1 do not count.
int n_dims(const std::vector<int64_t>& ne) {
    for (int i = static_cast<int>(ne.size()) - 1; i >= 1; --i) {
        if (ne[i] > 1) return i + 1;
    }
    return 1;
}

// tensor_allows_quantization: 2-D and 3-D weights, minus norms, routers, convolutions and the
// small or positional tensors llama-quantize keeps as they are.
bool allows_quantization(const gguf::TensorInfo& t) {
    if (n_dims(t.ne) < 2) return false;
    const std::string& n = t.name;
    if (n.size() < 6 || n.compare(n.size() - 6, 6, "weight") != 0) return false;
    static const char* const kKept[] = {
        "_norm.weight", "ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj", "ssm_conv1d",
        "shortconv.conv.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
        "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
        "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
        "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
        "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger",
    };
    for (const char* k : kKept) {
        if (has(n, k)) return false;
    }
    return n != "position_embd.weight" && n != "token_types.weight";
}

int layer_of(const std::string& name) {
    int layer = -1;
    if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1) return -1;
    return layer;
}

bool use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

uint32_t u32_or_first(const gguf::File& f, const std::string& key, uint32_t dflt) {
    const gguf::Value* v = f.find(key);
    if (!v) return dflt;
    if (v->type == gguf::ValueType::ARRAY) {
        if (v->ints.empty()) return dflt;
        return static_cast<uint32_t>(v->ints[0]);
    }
    return f.get_u32(key);
}

// The state llama_tensor_get_type_impl reads and advances.
struct MixState {
    FileType ftype;
    std::string arch;
    int n_layer = 0;
    int n_expert = 0;
    uint32_t n_gqa = 0;
    bool is_70b = false;
    bool tied_embeddings = true;
    int n_attention_wv = 0, i_attention_wv = 0;
    int i_ffn_down = 0;

    bool falcon() const { return arch == "falcon"; }
    // For MoE files the layer comes from the name (experts of a layer are not consecutive).
    int layer(int counter, const std::string& name) const {
        if (n_expert <= 1) return counter;
        const int l = layer_of(name);
        if (l < 0 || l >= n_layer) {
            throw Error("tensor '" + name + "': cannot tell its layer (0.." + std::to_string(n_layer - 1) + ")");
        }
        return l;
    }
};

GgmlType mixed_type(MixState& s, GgmlType t, const gguf::TensorInfo& tensor, Category cat,
                    const QuantizeOptions& opt) {
    const FileType f = s.ftype;
    if (cat == Category::Output || (s.tied_embeddings && cat == Category::TokenEmbd)) {
        if (opt.output_type) return *opt.output_type;
        if (f == FileType::MXFP4_MOE) return GgmlType::Q8_0;
        if (s.falcon() || tensor.ne[0] % type_traits(t).block_elems != 0) return GgmlType::Q8_0;
        return t != GgmlType::Q8_0 ? GgmlType::Q6_K : t;
    }
    // MXFP4_MOE: the expert tensors (3-D) in MXFP4, everything else Q8_0.
    if (f == FileType::MXFP4_MOE) return tensor.ne.size() > 2 && tensor.ne[2] > 1 ? GgmlType::MXFP4 : GgmlType::Q8_0;
    if (cat == Category::TokenEmbd) return opt.token_embd_type ? *opt.token_embd_type : t;
    if (attn_v_like(cat)) {
        if ((f == FileType::IQ4_NL || f == FileType::IQ4_XS) && s.n_gqa >= 4) {
            t = GgmlType::Q5_K;
        } else if ((f == FileType::Q4_K_M || f == FileType::Q5_K_M) && use_more_bits(s.i_attention_wv, s.n_attention_wv)) {
            t = GgmlType::Q6_K;
        } else if (f == FileType::Q4_K_S && s.i_attention_wv < 4) {
            t = GgmlType::Q5_K;
        }
        if (s.is_70b && t == GgmlType::Q4_K) t = GgmlType::Q5_K;
        if (s.n_expert == 8) t = GgmlType::Q8_0;
        ++s.i_attention_wv;
    } else if (cat == Category::AttnK) {
        if (s.n_expert == 8) t = GgmlType::Q8_0;
    } else if (cat == Category::FfnDown) {
        const int i_layer = s.layer(s.i_ffn_down, tensor.name);
        const int n_layer = s.n_layer;
        if (f == FileType::Q4_K_M) {
            if (s.falcon()) {
                t = i_layer < n_layer / 16 ? GgmlType::Q6_K : use_more_bits(i_layer, n_layer) ? GgmlType::Q5_K : GgmlType::Q4_K;
            } else if (use_more_bits(i_layer, n_layer)) {
                t = GgmlType::Q6_K;
            }
        } else if (i_layer < n_layer / 8 && (f == FileType::IQ4_NL || f == FileType::IQ4_XS)) {
            t = GgmlType::Q5_K;
        } else if (f == FileType::Q5_K_M && use_more_bits(i_layer, n_layer)) {
            t = GgmlType::Q6_K;
        } else if (f == FileType::Q4_K_S && !s.falcon() && i_layer < n_layer / 8) {
            t = GgmlType::Q5_K;
        }
        ++s.i_ffn_down;
    } else if (cat == Category::AttnOutput) {
        if (!s.falcon() && s.n_expert == 8 &&
            (f == FileType::IQ4_NL || f == FileType::Q4_K_S || f == FileType::Q4_K_M || f == FileType::IQ4_XS)) {
            t = GgmlType::Q5_K;
        }
    } else if (cat == Category::FfnGate || cat == Category::FfnUp) {
        s.layer(0, tensor.name);  // llama-quantize checks the layer of MoE gate/up tensors too
    }
    return t;
}

// tensor_type_fallback: a type whose block does not divide the row length is replaced.
GgmlType fallback_type(const std::string& name, int64_t ncols, GgmlType t, bool& fell_back) {
    if (ncols % type_traits(t).block_elems == 0) return t;
    fell_back = true;
    GgmlType r;
    switch (t) {
        case GgmlType::IQ4_XS: r = GgmlType::IQ4_NL; break;
        case GgmlType::Q6_K: r = GgmlType::Q8_0; break;
        case GgmlType::Q4_K: r = GgmlType::Q5_0; break;
        case GgmlType::Q5_K: r = GgmlType::Q5_1; break;
        default:
            throw Error("tensor '" + name + "': " + std::to_string(ncols) + " columns do not fit " +
                        type_traits(t).name + " blocks and llama-quantize defines no fallback for it");
    }
    if (ncols % type_traits(r).block_elems != 0) r = GgmlType::F16;
    return r;
}

}  // namespace

FileType parse_file_type(const std::string& name) {
    std::string up = name;
    for (char& c : up) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    for (const FileTypeInfo& i : kFileTypes) {
        if (up == i.name) return i.type;
    }
    std::string list;
    for (const std::string& n : file_type_names()) list += (list.empty() ? "" : ", ") + n;
    throw Error("unknown quantization type '" + name + "' (expected one of " + list + ")");
}

const char* file_type_name(FileType t) { return info(t).name; }

std::vector<std::string> file_type_names() {
    std::vector<std::string> v;
    for (const FileTypeInfo& i : kFileTypes) v.push_back(i.name);
    return v;
}

std::vector<TensorQuantPlan> plan_quantization(const gguf::File& file, const QuantizeOptions& opt) {
    const GgmlType base = info(opt.type).base;
    MixState s;
    s.ftype = opt.type;
    s.arch = file.get_string_or("general.architecture", "");
    if (s.arch.empty()) throw Error(file.path() + ": no general.architecture key");
    s.n_layer = static_cast<int>(file.get_u32_or(s.arch + ".block_count", 0));
    s.n_expert = static_cast<int>(file.get_u32_or(s.arch + ".expert_count", 0));
    const uint32_t n_head = u32_or_first(file, s.arch + ".attention.head_count", 0);
    const uint32_t n_head_kv = u32_or_first(file, s.arch + ".attention.head_count_kv", n_head);
    s.n_gqa = n_head_kv == 0 ? 0 : n_head / n_head_kv;
    s.is_70b = s.arch == "llama" && s.n_layer == 80 && n_head != n_head_kv;

    std::vector<const gguf::TensorInfo*> order;
    for (const gguf::TensorInfo& t : file.tensors()) order.push_back(&t);
    std::stable_sort(order.begin(), order.end(), [](const gguf::TensorInfo* a, const gguf::TensorInfo* b) {
        const int la = layer_of(a->name), lb = layer_of(b->name);
        if (la != lb) return la < lb;
        return a->name < b->name;
    });
    for (const gguf::TensorInfo* t : order) {
        const Category c = category_of(t->name);
        if (attn_v_like(c)) ++s.n_attention_wv;
        if (c == Category::Output) s.tied_embeddings = false;
    }

    std::vector<TensorQuantPlan> plan;
    for (const gguf::TensorInfo* t : order) {
        TensorQuantPlan p{t->name, t->type, t->type, t->ne, false};
        if (allows_quantization(*t)) {
            const Category c = category_of(t->name);
            if (opt.token_embd_type && c == Category::TokenEmbd) {
                p.to = *opt.token_embd_type;
            } else if (opt.output_type && c == Category::Output) {
                p.to = *opt.output_type;
            } else {
                p.to = base;
                if (!opt.pure && is_block_quantized(base)) {
                    p.to = mixed_type(s, base, *t, c, opt);
                    p.to = fallback_type(t->name, t->ne[0], p.to, p.fell_back);
                }
            }
            if (t->ne[0] % type_traits(p.to).block_elems != 0) {
                throw Error(file.path() + ": tensor '" + t->name + "': its rows of " + std::to_string(t->ne[0]) +
                            " values do not fit " + type_traits(p.to).name + " blocks");
            }
        }
        if (p.to != p.from && is_block_quantized(p.from) && !opt.allow_requantize) {
            throw Error(file.path() + ": tensor '" + t->name + "' is already " + type_traits(p.from).name +
                        "; quantizing it again to " + type_traits(p.to).name +
                        " compounds the error (pass --allow-requantize to do it anyway)");
        }
        plan.push_back(std::move(p));
    }
    return plan;
}

QuantizeReport quantize_file(const std::string& in, const std::string& out, const QuantizeOptions& opt) {
    auto file = gguf::File::open(in);
    QuantizeReport rep;
    rep.tensors = plan_quantization(*file, opt);

    // Metadata as llama-quantize writes it: the input's keys in order, without split keys,
    // then general.quantization_version and general.file_type (removed and appended).
    gguf::Writer w(file->alignment());
    for (const auto& [key, v] : file->metadata()) {
        if (key == "general.quantization_version" || key == "general.file_type" || key == "split.no" ||
            key == "split.count" || key == "split.tensors.count") {
            continue;
        }
        w.set(key, v);
    }
    w.set("general.quantization_version", gguf::Value::u32(2));
    w.set("general.file_type", gguf::Value::u32(static_cast<uint32_t>(opt.type)));
    // ggml writes n_dims without trailing 1s ([256, 1] is stored as [256]); so do we.
    for (const TensorQuantPlan& p : rep.tensors) {
        w.declare_tensor(p.name, p.to, std::vector<int64_t>(p.ne.begin(), p.ne.begin() + n_dims(p.ne)));
    }

    const int threads = opt.threads > 0 ? opt.threads : std::max(1u, std::thread::hardware_concurrency());
    w.write(out, [&](size_t i, std::vector<uint8_t>& bytes) {
        const TensorQuantPlan& p = rep.tensors[i];
        const gguf::TensorInfo& t = file->tensor(p.name);
        rep.bytes_in += t.nbytes;
        rep.n_elements += static_cast<uint64_t>(t.n_elements());
        if (p.to == p.from) {
            bytes.assign(t.data, t.data + t.nbytes);
            rep.bytes_out += bytes.size();
            return;
        }
        const int64_t ncols = p.ne[0];
        const int64_t nrows = ncols == 0 ? 0 : t.n_elements() / ncols;
        const size_t in_row = row_bytes(p.from, ncols);
        const size_t out_row = row_bytes(p.to, ncols);
        bytes.resize(static_cast<size_t>(nrows) * out_row);
        // Rows are independent, so the bytes do not depend on the thread count.
        const int n = static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(1, nrows / 16)));
        std::vector<std::thread> pool;
        std::vector<std::string> errors(n);
        for (int k = 0; k < n; ++k) {
            pool.emplace_back([&, k] {
                try {
                    std::vector<float> row(static_cast<size_t>(ncols));
                    for (int64_t r = nrows * k / n; r < nrows * (k + 1) / n; ++r) {
                        dequantize_row(p.from, t.data + static_cast<size_t>(r) * in_row, row.data(), ncols);
                        quantize_row(p.to, row.data(), bytes.data() + static_cast<size_t>(r) * out_row, ncols);
                    }
                } catch (const std::exception& e) {
                    errors[k] = e.what();
                }
            });
        }
        for (std::thread& th : pool) th.join();
        for (const std::string& e : errors) {
            if (!e.empty()) throw Error(in + ": tensor '" + p.name + "': " + e);
        }
        rep.bytes_out += bytes.size();
    });
    return rep;
}

// ---------------------------------------------------------------- the public API (alloy/quantize.h)

namespace {

// A single tensor type by its ggml name ("q6_k", "Q8_0", ...), for the override options.
GgmlType parse_tensor_type(const std::string& s, const char* option) {
    std::string low = s;
    for (char& c : low) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (uint32_t id = 0; id < 64; ++id) {
        if (type_supported(id) && type_name(id) == low) return static_cast<GgmlType>(id);
    }
    throw Error(std::string(option) + ": '" + s + "' is not a tensor type alloy writes (f32, f16, bf16, q8_0, q4_0, " +
                "q5_0, q5_1, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, mxfp4)");
}

}  // namespace

std::vector<std::string> quantize_type_names() { return file_type_names(); }

QuantizeResult quantize_model(const QuantizeRequest& r) {
    QuantizeOptions opt;
    opt.type = parse_file_type(r.type);
    opt.threads = r.threads;
    opt.allow_requantize = r.allow_requantize;
    opt.pure = r.pure;
    if (!r.output_tensor_type.empty()) opt.output_type = parse_tensor_type(r.output_tensor_type, "--output-tensor-type");
    if (!r.token_embedding_type.empty()) opt.token_embd_type = parse_tensor_type(r.token_embedding_type, "--token-embedding-type");
    if (r.input == r.output) throw Error("quantize: input and output are the same file '" + r.input + "'");
    QuantizeReport rep;
    if (r.dry_run) {
        auto file = gguf::File::open(r.input);
        rep.tensors = plan_quantization(*file, opt);
        for (const TensorQuantPlan& p : rep.tensors) {
            const gguf::TensorInfo& t = file->tensor(p.name);
            rep.bytes_in += t.nbytes;
            rep.n_elements += static_cast<uint64_t>(t.n_elements());
            rep.bytes_out += row_bytes(p.to, p.ne[0]) * static_cast<uint64_t>(t.n_elements() / p.ne[0]);
        }
    } else {
        rep = quantize_file(r.input, r.output, opt);
    }
    QuantizeResult out;
    out.bytes_in = rep.bytes_in;
    out.bytes_out = rep.bytes_out;
    out.n_elements = rep.n_elements;
    for (const TensorQuantPlan& p : rep.tensors) {
        out.tensors.push_back({p.name, p.ne, type_name(static_cast<uint32_t>(p.from)), type_name(static_cast<uint32_t>(p.to)),
                               p.fell_back});
    }
    return out;
}

}  // namespace alloy
