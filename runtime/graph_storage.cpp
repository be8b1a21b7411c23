#include "runtime/graph_storage.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "alloy/error.h"

namespace alloy {

GraphLayout plan_storage(const graph::Graph& g, int bucket) {
    const size_t nt = g.tensors.size();
    std::vector<int> root(nt);
    std::iota(root.begin(), root.end(), 0);
    auto find = [&](int t) {
        while (root[size_t(t)] != t) t = root[size_t(t)] = root[size_t(root[size_t(t)])];
        return t;
    };
    for (const graph::Node& n : g.nodes)
        if (n.inplace >= 0) {
            const int a = n.out[0], b = n.in[size_t(n.inplace)];
            if (g.tensors[size_t(a)].cols != g.tensors[size_t(b)].cols)
                throw Error("graph storage: node '" + n.label + "' stores in place over a tensor of another width");
            root[size_t(find(a))] = find(b);
        }
    std::vector<int> first(nt, -1), last(nt, -1);
    std::vector<int64_t> size(nt, 0);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const graph::Node& n = g.nodes[i];
        auto touch = [&](int t) {
            if (g.tensors[size_t(t)].logits) return;
            const int r = find(t);
            if (first[size_t(r)] < 0) first[size_t(r)] = int(i);
            last[size_t(r)] = int(i);
            // Rows of `bucket` tokens, rounded up to whole 64-byte lines so tensors start aligned.
            size[size_t(r)] = std::max(size[size_t(r)], (int64_t(bucket) * g.tensors[size_t(t)].cols + 15) / 16 * 16);
        };
        for (int t : n.out) touch(t);
        for (int t : n.in) touch(t);
    }
    std::vector<int> order;
    for (size_t t = 0; t < nt; ++t)
        if (find(int(t)) == int(t) && first[t] >= 0) order.push_back(int(t));
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return size[size_t(a)] > size[size_t(b)]; });
    GraphLayout L;
    L.offset.assign(nt, -1);
    std::vector<int> placed;
    for (int s : order) {
        std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of overlapping lifetimes
        for (int p : placed)
            if (first[size_t(p)] <= last[size_t(s)] && first[size_t(s)] <= last[size_t(p)])
                busy.emplace_back(L.offset[size_t(p)], L.offset[size_t(p)] + size[size_t(p)]);
        std::sort(busy.begin(), busy.end());
        int64_t at = 0;
        for (const auto& [b, e] : busy) {
            if (at + size[size_t(s)] <= b) break;
            at = std::max(at, e);
        }
        L.offset[size_t(s)] = at;
        L.total = std::max(L.total, at + size[size_t(s)]);
        placed.push_back(s);
    }
    for (size_t t = 0; t < nt; ++t) L.offset[t] = L.offset[size_t(find(int(t)))];
    return L;
}

}  // namespace alloy
