#!/usr/bin/env python3
"""The layering of ../shared/DESIGN.md, checked over the #include lines (run by ctest).

Arrows point down only: each folder may include the folders listed for it and nothing else.
KNOWN lists today's exceptions, each with the issue that removes it; the check fails on any
include that is neither allowed nor listed, and on a listed exception that no longer occurs
(so the list can only shrink). Usage: check_layering.py REPO_ROOT
"""
import pathlib
import re
import sys

ALLOWED = {
    "format": ["alloy/", "format/"],
    "tokenizer": ["alloy/", "format/", "tokenizer/"],
    # "kernels/*": the shared contracts in kernels/ itself (not a sibling backend's folder).
    "kernels/ref": ["alloy/", "format/", "kernels/ref/", "kernels/*"],
    "kernels/cpu": ["alloy/", "format/", "kernels/ref/", "kernels/cpu/", "kernels/*"],
    "kernels/cuda": ["alloy/", "format/", "kernels/ref/", "kernels/cuda/", "kernels/*"],
    "model": ["alloy/", "format/", "tokenizer/", "kernels/", "model/"],
    "runtime": ["alloy/", "format/", "tokenizer/", "kernels/", "model/", "runtime/"],
    "server": ["alloy/", "server/"],
    "cli": ["alloy/", "cli/"],
}
SUBFOLDERS = ["kernels/ref", "kernels/cpu", "kernels/cuda"]  # matched before their parent

# (file, included folder prefix): why it is allowed for now.
KNOWN = {
    # DESIGN.md: "test-ops/bench may reach kernels".
    ("cli/bench.cpp", "kernels/"): "allowed: bench reaches kernels (DESIGN.md)",
    ("cli/bench.cpp", "runtime/"): "allowed: bench times the model's forward itself (DESIGN.md)",
    ("cli/profile.cpp", "kernels/"): "allowed: profile times each kernel (a benchmark, DESIGN.md)",
    ("cli/profile.cpp", "runtime/"): "allowed: profile times each kernel (a benchmark, DESIGN.md)",
    ("cli/test_ops.cpp", "kernels/"): "allowed: test-ops reaches kernels (DESIGN.md)",
    ("cli/batched_bench.cpp", "kernels/"): "allowed: a benchmark reaches kernels (DESIGN.md)",
    ("cli/batched_bench.cpp", "runtime/"): "allowed: a benchmark of the batched forward itself, below the Engine",
    ("cli/test_ops.cpp", "format/"): "allowed: test-ops builds quantized weights",
    ("cli/cuda/test_ops_cuda.h", "kernels/"): "allowed: test-ops --backend cuda reaches kernels (DESIGN.md)",
    ("cli/cuda/test_ops_cuda.cpp", "kernels/"): "allowed: test-ops --backend cuda reaches kernels (DESIGN.md)",
    ("cli/cuda/test_ops_cuda.cpp", "format/"): "allowed: test-ops --backend cuda names weight types",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(rel):
    for sub in SUBFOLDERS:
        if rel.startswith(sub + "/"):
            return sub
    top = rel.split("/", 1)[0]
    return top if top in ALLOWED else None


def main(root):
    root = pathlib.Path(root)
    bad, seen = [], set()
    for path in sorted(root.rglob("*")):
        if path.suffix not in {".h", ".cpp", ".cu", ".cuh", ".inc"} or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("build", ".")):
            continue
        folder = folder_of(rel)
        if folder is None:
            continue  # tests, bench, fuzz: may include anything
        for inc in INCLUDE.findall(path.read_text(errors="replace")):
            if "/" not in inc:
                continue  # a generated header next to the build, or a same-folder name
            if any(inc.startswith(p) if not p.endswith("*") else (inc.startswith(p[:-1]) and inc.count("/") == 1)
                   for p in ALLOWED[folder]):
                continue
            prefix = next((p for p in ("kernels/", "format/", "tokenizer/", "model/", "runtime/", "server/", "cli/", "alloy/")
                           if inc.startswith(p)), inc)
            key = (rel, prefix)
            if key in KNOWN:
                seen.add(key)
                continue
            bad.append(f"{rel}: includes \"{inc}\" ({folder}/ may include only {', '.join(ALLOWED[folder])})")
    stale = [f"{f} -> {p}: listed as an exception but no longer included; remove it from KNOWN"
             for (f, p) in sorted(KNOWN) if (f, p) not in seen]
    for line in bad + stale:
        print(line)
    print(f"layering: {len(bad)} violations, {len(stale)} stale exceptions, {len(seen)} known exceptions "
          f"({sum(1 for k in seen if not KNOWN[k].startswith('allowed'))} to remove with issue 17)")
    return 1 if bad or stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
