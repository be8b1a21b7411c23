// Rewrites of a step's graph (model/graph.h) between the model that builds it and the backend
// that runs it. Each keeps the results bit for bit: a fused op computes exactly what its parts
// do (the kernels' contracts), and pruned rows are ones no result depends on.
#pragma once
#include "model/graph.h"

namespace alloy::graph {

// Which rows every node computes. Backward from the logits (spec.logits rows), a row-wise node
// computes the rows its readers need, the state writers (KvStore, GdnFused) every row, and a
// node whose results nobody needs is dropped. So the last layer of a pass that returns only the
// last token's logits runs its queries, attention, output projection and MLP on that row alone,
// and an inner piece of a long prompt (no logits) stops after storing the last layer's K/V or
// GDN state, as llama.cpp's output ids do (3.5% of the 0.8B's weight products). Listed rows
// (a batch's logits rows) are gathered by the RmsNorm that first needs them (the output norm),
// which reads every row of its input; the nodes after it read them compact.
void prune_rows(Graph& g);

// The nodes whose results nothing reads dropped (the tensors they wrote no longer logits), in
// one backward pass; nodes that write state (KvStore, GdnFused) or sum over tensor-parallel
// ranks (AllReduce: every rank must take part) stay. A tensor-parallel rank other than 0 drops
// its final norm and LM head with this once its logits tensor is unmarked.
void drop_unread(Graph& g);

// An Add followed by the RmsNorm of its sum over the same rows: one AddRmsNorm (the residual
// add and the next norm in one pass over the row, also across layers).
void fuse_add_norm(Graph& g);

// Two Matmuls of one input and the Swiglu that alone reads both: one MatmulSwiglu (SwiGLU in the
// GEMM epilogue; the up product becomes the node's scratch output).
void fuse_matmul_swiglu(Graph& g);

// Consecutive Matmuls reading the same tensor over the same rows: one MatmulMulti (activations
// prepared once, one parallel region).
void group_matmuls(Graph& g);

// Checks the graph a backend is given: every tensor read is written before (or is the
// logits sink), rows consistent; throws alloy::Error naming the node.
void check(const Graph& g);

}  // namespace alloy::graph
