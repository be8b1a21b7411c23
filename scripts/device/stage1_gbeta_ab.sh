# Device job (run by .devbin/run.sh, which unpacks .devbin/*.xz onto PATH): stage 1 with g / beta loaded
# before the tile copies (branch wip-stage1-gbeta-first) against the main before it (5d82533); run in
# session 48 and merged as dbdd573 (RESULTS row), kept as the template of an A / B job. Binaries: gdn_cuda_bench_old (main),
# gdn_cuda_bench (the branch), gdn_cuda_bench_clk (the branch, -DALLOY_GDN_EXP_CLOCK), test_cuda (the branch).
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "GPU: $name"
A=gdn_cuda_bench_old; B=gdn_cuda_bench
echo "$(timeout 40 gdn_cuda_bench_clk --prefill --gate-only --t 4096 --hv 16 2>&1 | grep s1clk | cut -c1-300)"
for c in "4096 16" "1000 48"; do set -- $c; for b in $A $B; do echo "$b $(timeout 40 $b --prefill --gate-only --hash --t $1 --hv $2 2>&1 | grep hash)"; done; done
for c in "4096 16" "4096 48" "16384 16" "65536 16"; do set -- $c; for b in $A $B $B $A; do echo "$b T $1 H_v $2: $(timeout 60 $b --prefill --gate-only --t $1 --hv $2 2>&1 | grep -E '^\| *[0-9]' | cut -d'|' -f2-7)"; done; done
for b in $A $B; do echo "$b s1 T 16384: $(timeout 40 ncu -c 2 --clock-control none --metrics gpu__time_duration.sum -k regex:stage1_kernel $b --prefill --gate-only --t 16384 --hv 16 --reps 1 2>&1 | grep -E 'duration' | awk '{print $NF}' | tr '\n' ' ')"; done
timeout 100 test_cuda --gtest_filter='CudaGdn*' 2>&1 | tail -2
