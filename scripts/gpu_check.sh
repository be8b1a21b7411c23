#!/usr/bin/env bash
# Every GPU test and GPU benchmark of a CUDA build, in one command, on the device machine, from
# the repository root:
#
#   scripts/gpu_check.sh [BUILD_DIR]      (default build-gpu)
#
# Runs the GPU test binaries (tests/cuda/*.cpp build into test_cuda; each test skips without a
# device, so here a skipped test counts as a failure: the device was not seen), then
# ops_cuda_bench and gdn_cuda_bench with their default tables, then (when BUILD_DIR has the
# alloy binary) the whole model on the GPU: alloy bench / profile --backend cuda. LD_LIBRARY_PATH gets
# /usr/local/cuda/lib64 (the binaries link cudart statically and cuBLAS dynamically). Where $OUT
# is set (the device tool's output folder), each binary's full output is also written there
# (test_cuda.log, ops_cuda_bench.log, gdn_cuda_bench.log). Exits non-zero if a test fails or
# skips, a binary is missing, or a benchmark exits non-zero; the last lines say which.
set -u
B=${1:-build-gpu}
# BUILD_DIR/lib: the Debian .so files `ldd` names (pcre2, utf8proc, cpp-httplib, brotli), carried
# beside the binaries to the Ubuntu device machine, which lacks them.
export LD_LIBRARY_PATH=$(cd "$B" 2>/dev/null && pwd)/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The fixtures the whole-model tests read (test_cuda_backend.cpp), from this checkout.
export ALLOY_SOURCE_DIR=$PWD
LOGS=${OUT:-$(mktemp -d)}
TESTS=(test_cuda)
BENCHES=(ops_cuda_bench gdn_cuda_bench)
failed=()

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || failed+=("nvidia-smi")

for t in "${TESTS[@]}"; do
    if [ ! -x "$B/$t" ]; then
        echo "gpu_check: $B/$t missing"
        failed+=("$t (missing)")
        continue
    fi
    echo "== $t"
    "$B/$t" --gtest_brief=1 >"$LOGS/$t.log" 2>&1
    rc=$?
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|^\[ chunked \]|tests ran" "$LOGS/$t.log"
    if [ $rc -ne 0 ]; then
        failed+=("$t (exit $rc)")
    elif grep -q "^\[  SKIPPED \]" "$LOGS/$t.log"; then
        failed+=("$t (tests skipped: no device seen)")
    fi
done

for b in "${BENCHES[@]}"; do
    if [ ! -x "$B/$b" ]; then
        echo "gpu_check: $B/$b missing"
        failed+=("$b (missing)")
        continue
    fi
    echo "== $b"
    "$B/$b" >"$LOGS/$b.log" 2>&1
    rc=$?
    cat "$LOGS/$b.log"
    [ $rc -ne 0 ] && failed+=("$b (exit $rc)")
done

# The whole model on the GPU (runtime/cuda/, --backend cuda), when the build has the alloy
# binary: 0.8B synthetic Q8_0 and BF16 files made here (too big to carry), llama-bench's
# tests, and a profile of one 4096-token prefill and decode steps.
if [ -x "$B/alloy" ]; then
    M=${TMPDIR:-/tmp}/gpu_check_models
    mkdir -p "$M"
    for t in q8_0 bf16; do
        [ -f "$M/0.8b-$t.gguf" ] || "$B/alloy" synth --preset 0.8b --dtype $t -o "$M/0.8b-$t.gguf" >/dev/null 2>&1 ||
            failed+=("synth 0.8b $t")
        echo "== alloy bench --backend cuda, 0.8b $t"
        timeout 300 "$B/alloy" bench --backend cuda -m "$M/0.8b-$t.gguf" -p 512,4096 -n 128 -d 0,4096 -r 3 \
            >"$LOGS/bench_cuda_$t.log" 2>&1 || failed+=("alloy bench --backend cuda ($t)")
        cat "$LOGS/bench_cuda_$t.log"
    done
    echo "== alloy profile --backend cuda"
    timeout 200 "$B/alloy" profile --backend cuda -m "$M/0.8b-q8_0.gguf" -p 4096 -n 8 -c 4200 \
        --trace "$LOGS/trace_cuda.json" >"$LOGS/profile_cuda.log" 2>&1 || failed+=("alloy profile --backend cuda")
    head -60 "$LOGS/profile_cuda.log"
fi

if [ ${#failed[@]} -ne 0 ]; then
    echo "gpu_check: FAILED: ${failed[*]}"
    exit 1
fi
echo "gpu_check: all GPU tests passed, benchmarks ran (logs in $LOGS)"
