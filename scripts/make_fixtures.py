#!/usr/bin/env python3
"""Reference fixtures from Hugging Face transformers (the oracle for the end-to-end tests).

Runs on the device machine (transformers 5.17, torch 2.11), on its CPU in fp32 so the numbers do
not depend on GPU kernels:
    python3 scripts/make_fixtures.py OUT_DIR [NAME ...]   (only the named fixtures)

For each small random-init Qwen3.5 config below it writes OUT_DIR/<name>/:
    config.json, model.safetensors   the HF checkpoint (bf16 on disk; every weight is bf16-exact,
                                     and the reference runs in fp32 on exactly those values)
    reference.json                   token sequences, greedy continuations, top-2 margins
    logits_<i>.f32                   fp32 logits [n_tokens, vocab], little-endian, of sequence i
The configs cover: value heads = key heads (r=1), r=2 with untied embeddings, r=3 with 8 layers and
an MTP block in the checkpoint (ignored by HF, kept by our converter), the multimodal wrapper
layout of the published checkpoints (Qwen3_5ForConditionalGeneration with a tiny vision tower),
and the MoE model (Qwen3_5MoeForCausalLM: 6 experts, 2 per token, a shared expert).
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import save_file, load_file

VOCAB = 384


def text_config(**kw):
    base = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=32,
        linear_value_head_dim=32, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        max_position_embeddings=4096, initializer_range=0.1, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                         "mrope_interleaved": True},
    )
    base.update(kw)
    return base


FIXTURES = {
    "r1_tied": dict(kind="causal", text=text_config()),
    "r2_untied": dict(kind="causal", text=text_config(
        linear_num_value_heads=4, tie_word_embeddings=False, num_attention_heads=2,
        num_key_value_heads=1)),
    "r3_deep_mtp": dict(kind="causal", mtp=True, text=text_config(
        num_hidden_layers=8, hidden_size=96, intermediate_size=160, linear_num_value_heads=6,
        linear_key_head_dim=64, linear_value_head_dim=64)),
    "vlm_r2": dict(kind="vlm", text=text_config(linear_num_value_heads=4)),
    # Qwen3.5 MoE (qwen35moe): routed experts + gated shared expert in every layer, untied.
    "moe_r2": dict(kind="moe", text=text_config(
        linear_num_value_heads=4, tie_word_embeddings=False, num_experts=6, num_experts_per_tok=2,
        moe_intermediate_size=48, shared_expert_intermediate_size=40)),
}

SEQ_LENS = [37, 80]     # 80 crosses HF's 64-token GDN chunk
GEN_PROMPT_LEN = 11
GEN_TOKENS = 12


def bf16_exact_(model, gen):
    """Randomise norms (so the +1 folding is exercised) and round every weight to bf16."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                if "linear_attn.norm" in name:
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            if name.endswith("mlp.gate.weight"):
                # Router logits spread well apart (HF initialises the router to zeros: all ties),
                # so fp32 rounding differences between engines never flip a top-k choice.
                p.copy_(torch.randn(p.shape, generator=gen))
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def build(spec, seed):
    torch.manual_seed(seed)
    if spec["kind"] == "moe":
        cfg = transformers.Qwen3_5MoeTextConfig(**spec["text"])
        cfg.architectures = ["Qwen3_5MoeForCausalLM"]
        model = transformers.Qwen3_5MoeForCausalLM(cfg)
    elif spec["kind"] == "causal":
        cfg = transformers.Qwen3_5TextConfig(**spec["text"])
        cfg.architectures = ["Qwen3_5ForCausalLM"]
        model = transformers.Qwen3_5ForCausalLM(cfg)
    else:
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                      temporal_patch_size=2, spatial_merge_size=2,
                      out_hidden_size=spec["text"]["hidden_size"], num_position_embeddings=16)
        cfg = transformers.Qwen3_5Config(text_config=spec["text"], vision_config=vision,
                                         tie_word_embeddings=spec["text"]["tie_word_embeddings"])
        cfg.architectures = ["Qwen3_5ForConditionalGeneration"]
        model = transformers.Qwen3_5ForConditionalGeneration(cfg)
    model = model.to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    bf16_exact_(model, gen)
    return cfg, model


def add_fake_mtp(state, text_cfg, gen):
    """Published checkpoints carry one MTP block (mtp.*); HF ignores it, GGUF keeps it."""
    D = text_cfg["hidden_size"]
    nh, nkv, hd, inter = (text_cfg["num_attention_heads"], text_cfg["num_key_value_heads"],
                          text_cfg["head_dim"], text_cfg["intermediate_size"])
    def r(*shape):
        return (0.05 * torch.randn(*shape, generator=gen)).to(torch.bfloat16)
    extra = {
        "mtp.fc.weight": r(D, 2 * D),
        "mtp.pre_fc_norm_embedding.weight": r(D), "mtp.pre_fc_norm_hidden.weight": r(D),
        "mtp.norm.weight": r(D),
        "mtp.layers.0.input_layernorm.weight": r(D),
        "mtp.layers.0.post_attention_layernorm.weight": r(D),
        "mtp.layers.0.self_attn.q_proj.weight": r(2 * nh * hd, D),
        "mtp.layers.0.self_attn.k_proj.weight": r(nkv * hd, D),
        "mtp.layers.0.self_attn.v_proj.weight": r(nkv * hd, D),
        "mtp.layers.0.self_attn.o_proj.weight": r(D, nh * hd),
        "mtp.layers.0.self_attn.q_norm.weight": r(hd), "mtp.layers.0.self_attn.k_norm.weight": r(hd),
        "mtp.layers.0.mlp.gate_proj.weight": r(inter, D), "mtp.layers.0.mlp.up_proj.weight": r(inter, D),
        "mtp.layers.0.mlp.down_proj.weight": r(D, inter),
    }
    state.update(extra)


def main():
    out_root = sys.argv[1]
    only = set(sys.argv[2:])  # optional fixture names: regenerate just those
    print("torch", torch.__version__, "transformers", transformers.__version__, flush=True)
    rng = np.random.default_rng(1234)
    for idx, (name, spec) in enumerate(FIXTURES.items()):
        if only and name not in only:
            continue
        out = os.path.join(out_root, name)
        os.makedirs(out, exist_ok=True)
        cfg, model = build(spec, seed=100 + idx)
        # Save (bf16 on disk; exact because every value is bf16-representable).
        model.save_pretrained(out, safe_serialization=True)
        st_path = os.path.join(out, "model.safetensors")
        state = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(st_path).items()}
        if spec.get("mtp"):
            add_fake_mtp(state, spec["text"], torch.Generator().manual_seed(7))
            cj = json.load(open(os.path.join(out, "config.json")))
            cj["mtp_num_hidden_layers"] = 1
            json.dump(cj, open(os.path.join(out, "config.json"), "w"), indent=1)
        save_file(state, st_path, metadata={"format": "pt"})
        for f in os.listdir(out):
            if f.endswith(".json") and f not in ("config.json",):
                os.remove(os.path.join(out, f))

        ref = {"name": name, "vocab": VOCAB, "sequences": [], "greedy": []}
        with torch.no_grad():
            for i, T in enumerate(SEQ_LENS):
                ids = rng.integers(0, VOCAB, size=T).tolist()
                logits = model(input_ids=torch.tensor([ids])).logits[0].to(torch.float32).numpy()
                logits.astype("<f4").tofile(os.path.join(out, f"logits_{i}.f32"))
                ref["sequences"].append({"ids": ids, "file": f"logits_{i}.f32"})
            prompt = rng.integers(0, VOCAB, size=GEN_PROMPT_LEN).tolist()
            g = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=GEN_TOKENS,
                               do_sample=False, min_new_tokens=GEN_TOKENS,
                               output_scores=True, return_dict_in_generate=True,
                               pad_token_id=0, eos_token_id=None)
            new = g.sequences[0, len(prompt):].tolist()
            margins = []
            for s in g.scores:
                top = torch.topk(s[0].float(), 2).values
                margins.append(float(top[0] - top[1]))
            ref["greedy"].append({"prompt": prompt, "generated": new, "top2_margins": margins})
        json.dump(ref, open(os.path.join(out, "reference.json"), "w"), indent=1)
        size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
        print(f"{name}: {size/1e6:.2f} MB, greedy {new}, min margin {min(margins):.4f}", flush=True)


if __name__ == "__main__":
    main()
