#!/bin/sh
# A copy of the alloy binary, away from the source tree and the build tree, runs its default
# model (issue 20: it used to stop with "cannot open" on the tokenizer.json path compiled in):
# the vocabulary is compiled in, the model is written to $ALLOY_HOME on first use.
# Usage: copied_binary_test.sh PATH/TO/alloy
set -eu
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$1" "$dir/alloy"
cd "$dir"
ALLOY_HOME="$dir/home" ./alloy run -p "Hello" -n 4 --temp 0 > out.txt 2> err.txt || { cat err.txt; exit 1; }
test -s "$dir/home/tiny-default-qwen35.gguf" || { echo "no default model in ALLOY_HOME"; exit 1; }
echo "Hello, how are you?" | tr -d '\n' > hello.txt
ids=$(ALLOY_HOME="$dir/home" ./alloy tokenize -m "$dir/home/tiny-default-qwen35.gguf" < hello.txt)
[ "$ids" = "9419 11 1204 513 488 30" ] || { echo "default model's vocabulary gave '$ids'"; exit 1; }
echo "copied binary: default model written and tokenizes as Qwen3.5"
