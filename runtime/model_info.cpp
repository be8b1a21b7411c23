#include "runtime/model_info.h"

#include <sys/resource.h>

#include <fstream>
#include <map>

#include "model/quantize.h"

namespace alloy {

ModelInfo model_info(const Qwen35Model& m) {
    ModelInfo info;
    const Qwen35HParams& hp = m.hparams();
    std::map<uint32_t, uint64_t> bytes_by_type;
    uint64_t mtp_bytes = 0, unrouted_bytes = 0;  // the latter: expert bytes a token does not read
    const std::string mtp_prefix = "blk." + std::to_string(hp.n_layer) + ".";
    for (const auto& t : m.file().tensors()) {
        info.file_bytes += t.nbytes;
        info.n_params += uint64_t(t.n_elements());
        if (t.ne.size() >= 2) bytes_by_type[uint32_t(t.type)] += t.nbytes;
        if (hp.n_layer_mtp && t.name.rfind(mtp_prefix, 0) == 0) mtp_bytes += t.nbytes;
        const bool is_matrix = t.ne.size() >= 2 && t.name != "token_embd.weight" && t.name != "output.weight" &&
                               t.name.find("conv1d") == std::string::npos && t.name.rfind(mtp_prefix, 0) != 0;
        // A token reads (and multiplies by) only n_expert_used of a layer's n_expert experts.
        const bool routed = hp.moe() && t.name.find("_exps.") != std::string::npos && t.name.rfind(mtp_prefix, 0) != 0;
        const double used = routed ? double(hp.n_expert_used) / hp.n_expert : 1.0;
        if (routed) unrouted_bytes += uint64_t(double(t.nbytes) * (1.0 - used));
        if (is_matrix) info.matmul_flops_per_token += 2.0 * double(t.n_elements()) * used;
    }
    // Decode reads every weight once (the LM head is token_embd when tied), not the MTP block,
    // plus the GDN recurrent and conv states, read and written.
    const bool tied = m.file().find_tensor("output.weight") == nullptr;
    const auto* emb = m.file().find_tensor("token_embd.weight");
    info.decode_bytes = info.file_bytes - mtp_bytes - unrouted_bytes - (tied || !emb ? 0 : emb->nbytes);
    int n_gdn = 0;
    for (int l = 0; l < hp.n_layer; ++l) n_gdn += hp.is_recurrent(l);
    const uint64_t state = uint64_t(hp.ssm_H_v) * hp.ssm_d_v * hp.ssm_d_k * 4 +
                           uint64_t(hp.conv_dim()) * (hp.conv_kernel - 1) * 4;
    info.decode_bytes += 2 * state * uint64_t(n_gdn);
    uint32_t dominant = 0;
    uint64_t most = 0;
    for (auto [t, b] : bytes_by_type)
        if (b > most) { most = b; dominant = t; }
    // The file's own mix name (general.file_type: "Q4_K_M") where llama.cpp's number is one alloy
    // knows: a small model's largest tensor is its embedding, whose type is not the mix's
    // (a Q4_K_M 0.8B is mostly Q6_K bytes).
    std::string type = type_name(dominant);
    const uint32_t ftype = m.file().get_u32_or("general.file_type", UINT32_MAX);
    for (const std::string& name : file_type_names())
        if (uint32_t(parse_file_type(name)) == ftype) type = name;
    info.description = hp.arch() + " " + std::to_string(hp.n_layer) + "L D" + std::to_string(hp.n_embd) + " " + type;
    return info;
}

std::string cpu_name() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("model name", 0) == 0) {
            auto p = line.find(':');
            if (p != std::string::npos) return line.substr(p + 2);
        }
    return "unknown";
}

uint64_t peak_rss_bytes() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return uint64_t(ru.ru_maxrss) * 1024;
}

}  // namespace alloy
