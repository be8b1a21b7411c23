"""Writes a test-vectors JSON file as the tokenizer tests read it: the header keys one per line,
then "cases" with one case per line (diffs stay readable). Shared by the vector generators."""
import json


def write_vectors(path, header, cases):
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        for k, v in header.items():
            f.write(f"{json.dumps(k)}: {json.dumps(v)},\n")
        f.write('"cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")
