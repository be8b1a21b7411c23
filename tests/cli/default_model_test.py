"""The trained default model (issue 20) against transformers, the oracle it was trained with.

testdata/default-model/reference.json holds what scripts/train_tiny_default.py measured on the
device in fp32 with transformers, on exactly the weights of the committed GGUF: the held-out
chapters' per-chunk negative log-likelihood (llama-perplexity's method, n_ctx 512) and 64
greedy tokens for three prompts. Checked here:
  1. the build finds the default (share/alloy/ beside the binary), no -m given;
  2. the file dequantized to F32 (lossless: Q4_0 codes and BF16 matrices) reproduces the 3 x 64
     greedy tokens exactly and the perplexity of the first 8 chunks to 2e-5;
  3. the default itself (Q4_0 LM head on Q8_0 activations, BF16 matrices) within 0.1%;
  4. `cmake --install` places binary and model so that the installed binary finds it;
  5. its MTP head (blk.8), run teacher-forced by `alloy perplexity --mtp` on the F32 file, agrees
     with the main head's next-next token about as often as the training script measured on all
     49 chunks (reference.json: 0.543; top-1 accuracy 0.391): a bound, since the reference has
     no per-chunk figure; a wrong pairing of hidden state and token, norm or position drops it
     far below.
Usage: default_model_test.py ALLOY CMAKE BUILD_DIR SOURCE_DIR
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

alloy, cmake, build, src = sys.argv[1:5]
ref = json.load(open(os.path.join(src, "testdata", "default-model", "reference.json")))
heldout = os.path.join(src, "testdata", "default-model", "heldout.txt")
CHUNKS = 8
nll = ref["heldout_fp32"]["nll_sum_per_chunk"][:CHUNKS]
ref_ppl = math.exp(sum(nll) / (CHUNKS * ref["heldout_fp32"]["scored_per_chunk"]))
failures = []


def run(args, **kw):
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def greedy(binary, model, prompt, n):
    args = [binary, "run", "--ids", " ".join(map(str, prompt)), "-n", str(n), "--temp", "0", "--print-ids", "-t", "2"]
    p = run(args + (["-m", model] if model else []))
    if "random weights" in p.stderr:
        failures.append(f"{binary}: took the random-weight fallback: {p.stderr.strip()}")
    return [int(x) for x in p.stdout.split()]


def perplexity(model, mtp=False):
    p = run([alloy, "perplexity", "-m", model, "-f", heldout, "--chunks", str(CHUNKS), "-t", "2"] + (["--mtp"] if mtp else []))
    m = re.search(r"PPL = ([0-9.]+)", p.stdout + p.stderr)
    if not m:
        sys.exit("no PPL in alloy perplexity's output:\n" + p.stdout + p.stderr)
    if not mtp:
        return float(m.group(1))
    a = re.search(r"agreement with the main head's next-next token ([0-9.]+), top-1 accuracy ([0-9.]+)", p.stdout)
    if not a:
        sys.exit("no MTP figures in alloy perplexity --mtp's output:\n" + p.stdout)
    return float(m.group(1)), float(a.group(1)), float(a.group(2))


def compare(what, got, want):
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        failures.append(f"{what}: differs from transformers from token {first}: {got[first:first + 8]} vs {want[first:first + 8]}")


default = os.path.join(build, "share", "alloy", "alloy-default-kjv.gguf")
if not os.path.isfile(default):
    sys.exit(f"{default}: not unpacked by the build")

with tempfile.TemporaryDirectory() as tmp:
    # 1. + 3.: the default, found without -m; its first 16 greedy tokens and perplexity.
    for prompt, want in zip(ref["prompts"], ref["greedy_64"]):
        compare(f"default model, prompt {prompt}, 16 tokens", greedy(alloy, None, prompt, 16), want[:16])
    ppl_q = perplexity(default)
    if abs(ppl_q - ref_ppl) / ref_ppl > 1e-3:
        failures.append(f"default model perplexity {ppl_q} vs transformers {ref_ppl:.4f}: more than 0.1% apart")
    # 2. the same weights in F32.
    f32 = os.path.join(tmp, "f32.gguf")
    run([alloy, "quantize", default, f32, "F32", "--allow-requantize"])
    for prompt, want in zip(ref["prompts"], ref["greedy_64"]):
        compare(f"F32, prompt {prompt}, 64 tokens", greedy(alloy, f32, prompt, 64), want)
    ppl_f, mtp_agree, mtp_acc = perplexity(f32, mtp=True)
    if abs(ppl_f - ref_ppl) / ref_ppl > 2e-5:
        failures.append(f"F32 perplexity {ppl_f} vs transformers {ref_ppl:.4f}: more than 2e-5 apart")
    ref_agree = ref["heldout_fp32"]["mtp_top1_agreement_with_main_next_next"]
    ref_acc = ref["heldout_fp32"]["mtp_top1_accuracy"]
    if abs(mtp_agree - ref_agree) > 0.08 or abs(mtp_acc - ref_acc) > 0.08:
        failures.append(f"MTP head over {CHUNKS} chunks: agreement {mtp_agree}, accuracy {mtp_acc}; the training script "
                        f"measured {ref_agree:.4f} / {ref_acc:.4f} over 49 (more than 0.08 apart)")
    # 4. an install prefix.
    prefix = os.path.join(tmp, "prefix")
    run([cmake, "--install", build, "--prefix", prefix])
    installed = os.path.join(prefix, "bin", "alloy")
    prompt, want = ref["prompts"][0], ref["greedy_64"][0]
    compare("installed binary", greedy(installed, None, prompt, 16), want[:16])

print(f"transformers (fp32, {CHUNKS} chunks): {ref_ppl:.4f}; alloy default {ppl_q:.4f}, F32 {ppl_f:.4f}; "
      f"MTP agreement {mtp_agree:.4f}, accuracy {mtp_acc:.4f} (training script, 49 chunks: {ref_agree:.4f} / {ref_acc:.4f})")
if failures:
    print("\n".join(failures))
    sys.exit(1)
print("default model: found, installed, and as transformers computes it")
