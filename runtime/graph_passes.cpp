#include "runtime/graph_passes.h"

#include <algorithm>

#include "alloy/error.h"

namespace alloy::graph {

namespace {

// The rows both of two needs cover.
Rows join(Rows a, Rows b) {
    if (a == b || b == Rows::None) return a;
    if (a == Rows::None) return b;
    return Rows::All;
}

bool writes_state(Op op) { return op == Op::KvStore || op == Op::GdnFused; }

// "blk.3.residual" + "blk.3.post_attention_norm" -> "blk.3.residual+post_attention_norm": the
// second label loses the layer prefix it shares with the first.
std::string join_labels(const std::string& a, const std::string& b) {
    const size_t dot = a.find('.', a.find('.') + 1);  // "blk.N." prefix
    if (a.rfind("blk.", 0) == 0 && dot != std::string::npos && b.compare(0, dot + 1, a, 0, dot + 1) == 0)
        return a + "+" + b.substr(dot + 1);
    return a + "+" + b;
}

void erase_marked(Graph& g, const std::vector<bool>& dead) {
    std::vector<Node> keep;
    keep.reserve(g.nodes.size());
    for (size_t i = 0; i < g.nodes.size(); ++i)
        if (!dead[i]) keep.push_back(std::move(g.nodes[i]));
    g.nodes = std::move(keep);
}

// The node that writes tensor t (-1: none).
std::vector<int> producers(const Graph& g) {
    std::vector<int> p(g.tensors.size(), -1);
    for (size_t n = 0; n < g.nodes.size(); ++n)
        for (int t : g.nodes[n].out) p[size_t(t)] = int(n);
    return p;
}

}  // namespace

void prune_rows(Graph& g) {
    std::vector<Rows> need(g.tensors.size(), Rows::None);
    for (size_t t = 0; t < g.tensors.size(); ++t) {
        if (g.tensors[t].logits) need[t] = g.spec.logits;
        if (name_matches(g.spec.keep_rows, g.tensors[t].name)) need[t] = Rows::All;
    }
    std::vector<bool> dead(g.nodes.size(), false);
    for (size_t i = g.nodes.size(); i-- > 0;) {
        Node& n = g.nodes[i];
        Rows r = Rows::None;
        for (int t : n.out) r = join(r, need[size_t(t)]);
        if (writes_state(n.op)) r = Rows::All;
        if (r == Rows::None) {
            dead[i] = true;
            continue;
        }
        n.rows = r;
        for (int t : n.out) g.tensors[size_t(t)].rows = r;
        // The RmsNorm of Listed rows gathers them from every row of its input; the nodes after
        // it (the LM head) read them compact.
        const Rows in_rows = writes_state(n.op) || (r == Rows::Listed && n.op == Op::RmsNorm) ? Rows::All : r;
        for (int t : n.in) need[size_t(t)] = join(need[size_t(t)], in_rows);
    }
    erase_marked(g, dead);
}

void drop_unread(Graph& g) {
    std::vector<bool> read(g.tensors.size(), false), dead(g.nodes.size(), false);
    for (size_t t = 0; t < g.tensors.size(); ++t) read[t] = g.tensors[t].logits;
    for (size_t i = g.nodes.size(); i-- > 0;) {
        const Node& n = g.nodes[i];
        bool live = writes_state(n.op) || n.op == Op::AllReduce || n.out.empty();
        for (int t : n.out) live = live || read[size_t(t)];
        if (!live) {
            dead[i] = true;
            continue;
        }
        for (int t : n.in) read[size_t(t)] = true;
    }
    erase_marked(g, dead);
}

void fuse_add_norm(Graph& g) {
    std::vector<bool> dead(g.nodes.size(), false);
    const auto readers = g.readers();
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        Node& add = g.nodes[i];
        if (dead[i] || add.op != Op::Add) continue;
        for (int j : readers[size_t(add.out[0])]) {
            Node& norm = g.nodes[size_t(j)];
            if (dead[size_t(j)] || norm.op != Op::RmsNorm || norm.rows != add.rows || add.rows == Rows::Listed) continue;
            add.op = Op::AddRmsNorm;
            add.out.push_back(norm.out[0]);
            add.norm = norm.norm;
            add.eps = norm.eps;
            add.label = join_labels(add.label, norm.label);
            dead[size_t(j)] = true;  // its input is ready where the add is, its readers come after it
            break;
        }
    }
    erase_marked(g, dead);
}

void fuse_matmul_swiglu(Graph& g) {
    std::vector<bool> dead(g.nodes.size(), false);
    const auto readers = g.readers();
    const auto prod = producers(g);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& s = g.nodes[i];
        if (s.op != Op::Swiglu) continue;
        const int pg = prod[size_t(s.in[0])], pu = prod[size_t(s.in[1])];
        if (pg < 0 || pu < 0 || pg == pu) continue;
        Node& gate = g.nodes[size_t(pg)];
        const Node& up = g.nodes[size_t(pu)];
        if (gate.op != Op::Matmul || up.op != Op::Matmul || gate.in[0] != up.in[0] || gate.rows != s.rows ||
            up.rows != s.rows || readers[size_t(s.in[0])].size() != 1 || readers[size_t(s.in[1])].size() != 1)
            continue;
        gate.op = Op::MatmulSwiglu;
        gate.weights = {gate.weights[0], up.weights[0]};
        gate.out = {s.out[0], up.out[0]};  // the activation; the up product, the kernel's scratch
        gate.label = join_labels(join_labels(gate.label, up.label), s.label);
        dead[size_t(pu)] = dead[i] = true;
    }
    erase_marked(g, dead);
}

void group_matmuls(Graph& g) {
    std::vector<bool> dead(g.nodes.size(), false);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        Node& first = g.nodes[i];
        if (dead[i] || first.op != Op::Matmul) continue;
        for (size_t j = i + 1; j < g.nodes.size(); ++j) {
            const Node& n = g.nodes[j];
            if (n.op != Op::Matmul || n.in[0] != first.in[0] || n.rows != first.rows) break;
            first.op = Op::MatmulMulti;
            first.weights.push_back(n.weights[0]);
            first.out.push_back(n.out[0]);
            first.label = join_labels(first.label, n.label);
            dead[j] = true;
        }
    }
    erase_marked(g, dead);
}

void check(const Graph& g) {
    std::vector<bool> ready(g.tensors.size(), false);
    for (const Node& n : g.nodes) {
        for (int t : n.in)
            if (!ready[size_t(t)])
                throw Error("graph: node '" + n.label + "' reads '" + g.tensors[size_t(t)].name + "' before it is written");
        if (n.rows == Rows::Listed && n.op != Op::RmsNorm)
            for (int t : n.in)
                if (g.tensors[size_t(t)].rows != Rows::Listed)
                    throw Error("graph: node '" + n.label + "' computes listed rows from '" + g.tensors[size_t(t)].name +
                                "', which holds every row (only rms_norm gathers rows)");
        for (int t : n.out) ready[size_t(t)] = true;
        if (n.inplace >= 0 && (n.inplace >= int(n.in.size()) || n.out.empty()))
            throw Error("graph: node '" + n.label + "' stores in place over an input it does not have");
    }
}

}  // namespace alloy::graph
