#!/usr/bin/env python3
"""The residual stream of transformers' forward, saved beside a fixture's logits, so that
`alloy logits --dump` (the graph's named tensors) is checked against the oracle layer by layer.

Runs on the device machine (transformers 5.17, torch 2.11, on its CPU in fp32, as
make_fixtures.py), over fixtures already committed (their weights are not regenerated):
    python3 scripts/fixture_hidden_states.py tests/fixtures/r2_untied tests/fixtures/r3_deep_mtp
For sequence 0 of each fixture it writes hidden_0.f32: fp32 [L + 2, T, D], little-endian:
the embedding output (alloy's h0), the output of each decoder layer l (blk.l.h, the residual
stream after the layer) and the final norm's output (hf), taken with forward hooks on the
modules themselves (not output_hidden_states, whose last entry conventions vary).
"""
import json
import os
import sys

import numpy as np
import torch
import transformers


def main():
    print("torch", torch.__version__, "transformers", transformers.__version__, flush=True)
    for d in sys.argv[1:]:
        ref = json.load(open(os.path.join(d, "reference.json")))
        model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        inner = model.model
        taken = {}

        def hook(name):
            def f(_module, _inputs, output):
                taken[name] = (output[0] if isinstance(output, tuple) else output)[0].detach().float().numpy()
            return f

        inner.embed_tokens.register_forward_hook(hook("h0"))
        for i, layer in enumerate(inner.layers):
            layer.register_forward_hook(hook(f"blk.{i}.h"))
        inner.norm.register_forward_hook(hook("hf"))
        ids = ref["sequences"][0]["ids"]
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
        names = ["h0"] + [f"blk.{i}.h" for i in range(len(inner.layers))] + ["hf"]
        out = np.stack([taken[n] for n in names]).astype("<f4")
        out.tofile(os.path.join(d, "hidden_0.f32"))
        ref["sequences"][0]["hidden"] = {"file": "hidden_0.f32", "tensors": names}
        json.dump(ref, open(os.path.join(d, "reference.json"), "w"), indent=1)
        print(f"{d}: hidden {out.shape} ({out.nbytes / 1e3:.0f} kB)", flush=True)


if __name__ == "__main__":
    main()
