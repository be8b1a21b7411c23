"""Trains alloy's default model (issue 20) on the device machine: a small Qwen3.5-architecture
model (GDN and gated-attention layers, 2 value heads per key head, the real Qwen3.5 / 3.6
vocabulary padded to 248,320 as the published models) with its MTP head, on the King James
Bible (scripts/make_kjv_corpus.py: Debian's bible-kjv-text, public domain text).

transformers builds and runs the trunk (Qwen3_5ForCausalLM, random init from CONFIG below). It
does not train the MTP block that published checkpoints carry (mtp.*, spec/MODEL.md section 8),
so that module is written here: e = RMSNorm(E[x_{t+1}]), hh = RMSNorm(h_t) with h_t the trunk's
last hidden state before its final norm, c = fc(concat(e, hh)), one full-attention decoder layer
at position t, then mtp.norm and the shared (tied) LM head predict x_{t+2}. Its loss is added to
the main one with weight MTP_WEIGHT.

The embedding (tied with the LM head) is what makes the file big (248,320 x 128), so the
committed GGUF stores it as Q4_0; the last part of training runs with it fake-quantized to Q4_0
(straight-through gradients), and at the end it is replaced by exactly the values that ggml's
quantize_row_q4_0_ref would store (computed on the CPU in fp32, the same operations), and every
other matrix is rounded to bf16. The model evaluated here in fp32 is then exactly the one the
GGUF (token_embd Q4_0, matrices BF16, norms F32) holds, so perplexities must agree.

Measured here in fp32 (TF32 off), on the held-out chapters, llama-perplexity's method (n_ctx
512 chunks from an empty state, only the second half scored): perplexity per chunk; the MTP
head's top-1 agreement with the main head's next-next greedy token (teacher-forced: MTP(h_t,
x_{t+1}) vs argmax main(t+1)) and its accuracy on x_{t+2}; greedy continuations of the prompts.

Inputs (DATA dir, from make_kjv_corpus.py + prompts.json of token-id lists).
Writes OUT/: config.json, rest.safetensors (every tensor but the embedding, fp32 holding bf16
values), embd_q4_0_codes.npy (uint8 [V, 16]: ggml's Q4_0 qs bytes, low nibble = element j,
high = j + 16), embd_q4_0_scales.npy (float16 [V, 4]), results.json, train.log.

Usage on the device: HF_HUB_OFFLINE=1 python3 scripts/train_tiny_default.py DATA OUT [--seconds S]
"""
import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers.models.qwen3_5 import modeling_qwen3_5 as M

VOCAB = 248320
CONFIG = dict(
    vocab_size=VOCAB, hidden_size=128, intermediate_size=512, num_hidden_layers=8,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
    linear_value_head_dim=64, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
    max_position_embeddings=4096, initializer_range=0.02, tie_word_embeddings=True,
    bos_token_id=None, eos_token_id=248044, pad_token_id=None,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                     "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                     "mrope_interleaved": True},
)
SEQ, BATCH = 512, 16
PEAK_LR, WARMUP_STEPS, WEIGHT_DECAY = 3e-3, 100, 0.1
MTP_WEIGHT = 0.3
QAT_FROM = 0.6          # fraction of the training time after which the embedding is fake-quantized
N_CTX = 512             # perplexity chunk (alloy perplexity / llama-perplexity default)


class MtpHead(nn.Module):
    """Qwen3.5's MTP block; parameter names match the checkpoints' mtp.* tensors."""

    def __init__(self, cfg):
        super().__init__()
        D, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.pre_fc_norm_embedding = M.Qwen3_5RMSNorm(D, eps=eps)
        self.pre_fc_norm_hidden = M.Qwen3_5RMSNorm(D, eps=eps)
        self.fc = nn.Linear(2 * D, D, bias=False)
        self.layers = nn.ModuleList([M.Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention"))])
        self.norm = M.Qwen3_5RMSNorm(D, eps=eps)

    def forward(self, h_prev, e_next, position_embeddings):
        c = self.fc(torch.cat([self.pre_fc_norm_embedding(e_next), self.pre_fc_norm_hidden(h_prev)], -1))
        return self.norm(self.layers[0](c, position_embeddings=position_embeddings, attention_mask=None))


def q4_0_exact(w):
    """ggml's quantize_row_q4_0_ref then dequantize, in fp32 on the CPU: returns (values, qs, d)."""
    w = w.detach().float().cpu().reshape(-1, 32)
    idx = w.abs().argmax(dim=1, keepdim=True)            # first of equal |x|, as ggml's strict '<'
    mx = torch.gather(w, 1, idx)
    d = mx / -8.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.clamp(torch.trunc(w * inv + 8.5), max=15)  # (int8_t)(x0 + 8.5f), MIN(15, .)
    d16 = d.half()
    vals = (q - 8.0) * d16.float()
    q = q.to(torch.uint8).reshape(-1, 32)
    qs = q[:, :16] | (q[:, 16:] << 4)
    return vals, qs, d16


def q4_0_fake_ste(w):
    """Differentiable stand-in for training (GPU arithmetic, straight-through gradient)."""
    b = w.reshape(-1, 32)
    idx = b.abs().argmax(dim=1, keepdim=True)
    d = torch.gather(b, 1, idx) / -8.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.clamp(torch.trunc(b * inv + 8.5), max=15)
    vals = ((q - 8.0) * d.half().float()).reshape(w.shape)
    return w + (vals - w).detach()


def rotary(model, x, T):
    pos = torch.arange(T, device=x.device).view(1, 1, -1).expand(3, x.shape[0], -1)
    return model.model.rotary_emb(x, pos)


def forward_losses(model, mtp, ids, W, captured):
    """Main and MTP cross-entropies for a batch [B, T] with embedding/head matrix W."""
    B, T = ids.shape
    emb = F.embedding(ids, W)
    out = model.model(inputs_embeds=emb, use_cache=False)
    h_pre = captured["h"]
    logits = out.last_hidden_state[:, :-1] @ W.t()
    loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    cos, sin = rotary(model, emb, T)
    hm = mtp(h_pre[:, :-1], emb[:, 1:], (cos[:, :T - 1], sin[:, :T - 1]))
    mlog = hm[:, :-1] @ W.t()
    mloss = F.cross_entropy(mlog.float().reshape(-1, VOCAB), ids[:, 2:].reshape(-1))
    return loss, mloss


def capture_pre_norm(model):
    captured = {}
    model.model.norm.register_forward_pre_hook(lambda mod, args: captured.__setitem__("h", args[0]))
    return captured


@torch.no_grad()
def evaluate(model, mtp, held, captured, exact_fp32, n_chunks=None):
    """llama-perplexity over the held-out ids; MTP agreement on the scored positions."""
    dev = next(model.parameters()).device
    n = len(held) // N_CTX if n_chunks is None else min(n_chunks, len(held) // N_CTX)
    chunks = torch.tensor(held[: n * N_CTX].astype(np.int64), device=dev).view(n, N_CTX)
    W = model.model.embed_tokens.weight
    first = N_CTX // 2
    nll_per_chunk, agree, mtp_hit, main_hit, count = [], 0, 0, 0, 0
    for s in range(0, n, 4):
        ids = chunks[s:s + 4]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not exact_fp32):
            emb = F.embedding(ids, W)
            out = model.model(inputs_embeds=emb, use_cache=False)
            logits = (out.last_hidden_state @ W.t()).float()               # [b, T, V]
            lp = torch.log_softmax(logits, -1)
            tgt = ids[:, first + 1:]
            nll = -lp[:, first:N_CTX - 1].gather(-1, tgt.unsqueeze(-1)).squeeze(-1)  # [b, T/2-1]
            nll_per_chunk += nll.double().sum(1).tolist()
            cos, sin = rotary(model, emb, N_CTX)
            hm = mtp(captured["h"][:, :-1], emb[:, 1:], (cos[:, :N_CTX - 1], sin[:, :N_CTX - 1]))
            mlog = (hm @ W.t()).float()                                     # [b, T-1, V]: predicts x_{t+2}
        greedy = logits.argmax(-1)                                          # [b, T]: main's x_{t+1}
        mtp_top = mlog.argmax(-1)                                           # [b, T-1]
        sl = slice(first, N_CTX - 2)                                        # t with x_{t+2} in the chunk
        agree += (mtp_top[:, sl] == greedy[:, first + 1:N_CTX - 1]).sum().item()
        mtp_hit += (mtp_top[:, sl] == ids[:, first + 2:]).sum().item()
        main_hit += (greedy[:, first:N_CTX - 1] == ids[:, first + 1:]).sum().item()
        count += ids.shape[0]
    per_chunk_tokens = N_CTX - 1 - first
    m_count = count * (N_CTX - 2 - first)
    ppl = math.exp(sum(nll_per_chunk) / (count * per_chunk_tokens))
    return dict(chunks=count, n_ctx=N_CTX, scored_per_chunk=per_chunk_tokens, perplexity=ppl,
                nll_sum_per_chunk=nll_per_chunk,
                mtp_top1_agreement_with_main_next_next=agree / m_count,
                mtp_top1_accuracy=mtp_hit / m_count,
                main_top1_accuracy=main_hit / (count * per_chunk_tokens))


def train(args, train_ids, held, log, seconds):
    torch.manual_seed(0)
    cfg = transformers.Qwen3_5TextConfig(**CONFIG)
    model = transformers.Qwen3_5ForCausalLM(cfg).cuda()
    mtp = MtpHead(cfg).cuda()
    mtp.apply(model._init_weights)
    captured = capture_pre_norm(model)
    params = [p for p in list(model.parameters()) + list(mtp.parameters())]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=PEAK_LR, betas=(0.9, 0.95), eps=1e-8, fused=True)
    data = torch.tensor(train_ids.astype(np.int64), device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(1)
    t0 = time.time()
    step, last_eval, tokens = 0, t0, 0
    while True:
        p = (time.time() - t0) / seconds
        if p >= 1.0:
            break
        lr = PEAK_LR * min(1.0, (step + 1) / WARMUP_STEPS) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(data) - SEQ - 1, (BATCH,), device="cuda", generator=gen)
        ids = data[starts[:, None] + torch.arange(SEQ, device="cuda")[None, :]]
        W = model.model.embed_tokens.weight
        Wq = q4_0_fake_ste(W) if p >= QAT_FROM else W
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, mloss = forward_losses(model, mtp, ids, Wq, captured)
        opt.zero_grad(set_to_none=True)
        (loss + MTP_WEIGHT * mloss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        tokens += BATCH * SEQ
        if time.time() - last_eval > 30 or step == 1:
            last_eval = time.time()
            model.eval(); mtp.eval()
            ev = evaluate(model, mtp, held, captured, exact_fp32=False, n_chunks=8)
            model.train(); mtp.train()
            log(f"step {step} t {time.time() - t0:.0f}s tokens {tokens} epochs {tokens / len(train_ids):.2f} "
                f"lr {lr:.2e} loss {loss.item():.3f} mtp {mloss.item():.3f} "
                f"held-out ppl(8 chunks, bf16) {ev['perplexity']:.2f} mtp-agree {ev['mtp_top1_agreement_with_main_next_next']:.3f}")
    log(f"trained {step} steps, {tokens} tokens ({tokens / len(train_ids):.2f} epochs) in {time.time() - t0:.0f}s")
    return cfg, model, mtp, dict(steps=step, tokens=tokens, epochs=tokens / len(train_ids),
                                 seconds=time.time() - t0)


def finish(args, cfg, model, mtp, held, prompts, train_info, log, out):
    """Exact weights (Q4_0 embedding, bf16 matrices), fp32 evaluation, files."""
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    emb_vals, qs, d16 = q4_0_exact(state["model.embed_tokens.weight"])
    rest = {}
    for k, v in list(state.items()) + [("mtp." + k, v.detach().float().cpu()) for k, v in mtp.state_dict().items()]:
        if k == "model.embed_tokens.weight":
            continue
        rest[k] = v.to(torch.bfloat16).float() if v.ndim >= 2 else v
    state["model.embed_tokens.weight"] = emb_vals.reshape(VOCAB, cfg.hidden_size)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    exact = transformers.Qwen3_5ForCausalLM(cfg).cuda().float().eval()
    missing = exact.load_state_dict({**{k: v for k, v in rest.items() if not k.startswith("mtp.")},
                                     "model.embed_tokens.weight": state["model.embed_tokens.weight"]},
                                    strict=False)
    assert not missing.unexpected_keys and set(missing.missing_keys) <= {"lm_head.weight"}, missing
    exact.tie_weights()
    assert exact.lm_head.weight.data_ptr() == exact.model.embed_tokens.weight.data_ptr()
    emtp = MtpHead(cfg).cuda().float().eval()
    emtp.load_state_dict({k[4:]: v for k, v in rest.items() if k.startswith("mtp.")})
    captured = capture_pre_norm(exact)
    ev = evaluate(exact, emtp, held, captured, exact_fp32=True)
    log(f"held-out fp32 exact weights: perplexity {ev['perplexity']:.4f} over {ev['chunks']} chunks; "
        f"MTP agreement {ev['mtp_top1_agreement_with_main_next_next']:.4f}, MTP accuracy "
        f"{ev['mtp_top1_accuracy']:.4f}, main accuracy {ev['main_top1_accuracy']:.4f}")
    gens = []
    with torch.no_grad():
        for pr in prompts:
            ids = torch.tensor([pr], device="cuda")
            g = exact.generate(ids, do_sample=False, max_new_tokens=64, min_new_tokens=64,
                               eos_token_id=None, pad_token_id=0)
            gens.append(g[0, len(pr):].tolist())
    os.makedirs(out, exist_ok=True)
    cj = exact.config.to_dict()
    cj["mtp_num_hidden_layers"] = 1
    cj["architectures"] = ["Qwen3_5ForCausalLM"]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cj, f, indent=1)
    save_file({k: v.contiguous() for k, v in rest.items()}, os.path.join(out, "rest.safetensors"))
    np.save(os.path.join(out, "embd_q4_0_codes.npy"), qs.numpy())
    np.save(os.path.join(out, "embd_q4_0_scales.npy"), d16.reshape(VOCAB, -1).numpy())
    res = dict(config=CONFIG, seq=SEQ, batch=BATCH, peak_lr=PEAK_LR, mtp_weight=MTP_WEIGHT,
               qat_from=QAT_FROM, train=train_info, heldout_fp32=ev,
               prompts=prompts, greedy_64=gens, torch=torch.__version__,
               transformers=transformers.__version__, device=torch.cuda.get_device_name())
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=270)
    ap.add_argument("--smoke", action="store_true", help="a few seconds of everything first")
    args = ap.parse_args()
    train_ids = np.fromfile(os.path.join(args.data, "train.u32"), dtype="<u4")
    held = np.fromfile(os.path.join(args.data, "heldout.u32"), dtype="<u4")
    prompts = json.load(open(os.path.join(args.data, "prompts.json")))
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "train.log"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n"); logf.flush()

    if args.smoke:
        cfg, model, mtp, info = train(args, train_ids, held[: 3 * N_CTX], log, 5)
        finish(args, cfg, model, mtp, held[: 2 * N_CTX], prompts[:1], info, log, "/tmp/smoke_out")
        log("smoke run passed")
    cfg, model, mtp, info = train(args, train_ids, held, log, args.seconds)
    finish(args, cfg, model, mtp, held, prompts, info, log, args.out)


if __name__ == "__main__":
    main()
