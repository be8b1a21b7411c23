#include "model/graph.h"

#include <sstream>

#include "alloy/error.h"

namespace alloy::graph {

const char* op_name(Op op) {
    switch (op) {
        case Op::Embed: return "embed";
        case Op::RmsNorm: return "rms_norm";
        case Op::Add: return "add";
        case Op::AddRmsNorm: return "add_rms_norm";
        case Op::Matmul: return "matmul";
        case Op::MatmulMulti: return "matmul_multi";
        case Op::Swiglu: return "swiglu";
        case Op::MatmulSwiglu: return "matmul_swiglu";
        case Op::RmsNormRope: return "rms_norm_rope";
        case Op::KvStore: return "kv_store";
        case Op::Attention: return "attention";
        case Op::SigmoidGateMul: return "sigmoid_gate_mul";
        case Op::GdnFused: return "gdn_fused";
        case Op::MoeFfn: return "moe_ffn";
        case Op::Input: return "input";
        case Op::AllReduce: return "all_reduce";
    }
    return "?";
}

const char* rows_name(Rows r) {
    switch (r) {
        case Rows::All: return "T";
        case Rows::Last: return "last";
        case Rows::Listed: return "listed";
        case Rows::None: return "none";
    }
    return "?";
}

bool name_matches(const std::vector<std::string>& patterns, const std::string& name) {
    for (const std::string& d : patterns) {
        if (d == name) return true;
        if (!d.empty() && d.back() == '*' && name.compare(0, d.size() - 1, d, 0, d.size() - 1) == 0) return true;
    }
    return false;
}

int Graph::add_tensor(std::string name, int64_t cols) {
    if (find(name) >= 0) throw Error("graph: tensor '" + name + "' defined twice");
    if (cols <= 0) throw Error("graph: tensor '" + name + "' has " + std::to_string(cols) + " columns");
    tensors.push_back({std::move(name), cols, Rows::All, false});
    return int(tensors.size()) - 1;
}

Node& Graph::add(Op op, std::string label, std::vector<int> in, std::vector<int> out) {
    for (int t : in)
        if (t < 0 || t >= int(tensors.size())) throw Error("graph: node '" + label + "' reads an undefined tensor");
    for (int t : out)
        if (t < 0 || t >= int(tensors.size())) throw Error("graph: node '" + label + "' writes an undefined tensor");
    Node n{};
    n.op = op;
    n.label = std::move(label);
    n.in = std::move(in);
    n.out = std::move(out);
    nodes.push_back(std::move(n));
    return nodes.back();
}

int Graph::find(const std::string& name) const {
    for (size_t i = 0; i < tensors.size(); ++i)
        if (tensors[i].name == name) return int(i);
    return -1;
}

std::vector<std::vector<int>> Graph::readers() const {
    std::vector<std::vector<int>> r(tensors.size());
    for (size_t n = 0; n < nodes.size(); ++n)
        for (int t : nodes[n].in) r[size_t(t)].push_back(int(n));
    return r;
}

std::string Graph::describe() const {
    std::ostringstream s;
    for (const Node& n : nodes) {
        s << n.label << "  " << op_name(n.op) << " ";
        for (size_t i = 0; i < n.in.size(); ++i) s << (i ? ", " : "") << tensors[size_t(n.in[i])].name;
        s << " ->";
        for (size_t i = 0; i < n.out.size(); ++i) {
            const Tensor& t = tensors[size_t(n.out[i])];
            s << (i ? ", " : " ") << t.name << " [" << rows_name(t.rows) << ", " << t.cols << "]";
        }
        if (n.layer >= 0 && (n.op == Op::KvStore || n.op == Op::Attention || n.op == Op::GdnFused))
            s << (n.op == Op::GdnFused ? "  (state: conv, recurrent of layer " : "  (state: KV cache of layer ") << n.layer << ")";
        s << "\n";
    }
    return s.str();
}

}  // namespace alloy::graph
