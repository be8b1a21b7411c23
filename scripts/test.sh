#!/usr/bin/env bash
# The whole test suite: dependencies, the Release build (as README's first command builds
# it), the libFuzzer targets (clang, second build dir), then ctest: unit, op, end-to-end
# against transformers fixtures, CLI, `alloy test-ops` and bounded fuzz runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# The official openai client (PyPI) for tests/server/openai_client_test.py, in a venv of its own;
# without PyPI that test reports itself skipped.
if [ ! -x build/pyenv/bin/python ] || ! build/pyenv/bin/python -c "import openai" 2>/dev/null; then
  python3 -m venv build/pyenv && build/pyenv/bin/pip install -q "openai==3.57.0" ||
    echo "test.sh: could not install the openai client; openai_client will be skipped"
fi
jobs=$(nproc)
cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DALLOY_FUZZ=ON >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_gguf fuzz_safetensors fuzz_tokenizer fuzz_request
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DALLOY_FUZZ_BIN_DIR="$PWD/build-fuzz" >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure
