import sys, os, re, numpy as np
# Diffs two `alloy logits -o A --dump "*"` runs tensor by tensor, in graph order (LIST: the
# output of `alloy logits --dump list` on the same backend): prints the first differing tensors
# and how far apart. Usage: diff_dumps.py LIST A B (A, B: the two -o paths).
names = []
for line in open(sys.argv[1]):
    m = re.search(r"->\s*(.*)$", line)
    if not m: continue
    for part in m.group(1).split(","):
        n = part.strip().split(" ")[0]
        if n and n not in names: names.append(n)
names.append("logits")
a, b = sys.argv[2], sys.argv[3]
ndiff = 0; first = None; shown = 0
for n in names:
    fa, fb = f"{a}.{n}.f32", f"{b}.{n}.f32"
    if not (os.path.exists(fa) and os.path.exists(fb)): continue
    x = np.fromfile(fa, dtype=np.float32); y = np.fromfile(fb, dtype=np.float32)
    if x.size != y.size: print(n, "size differs"); continue
    if x.tobytes() != y.tobytes():
        ndiff += 1
        d = np.abs(x.astype(np.float64) - y); rel = d.max() / max(1e-30, np.abs(x).max())
        nbad = int((x != y).sum())
        if shown < 6:
            print(f"  differs: {n}: {nbad} of {x.size} values, max abs {d.max():.3e}, max rel {rel:.3e}, nan {np.isnan(x).sum()}/{np.isnan(y).sum()}")
            shown += 1
print(f"  {ndiff} tensors differ")
