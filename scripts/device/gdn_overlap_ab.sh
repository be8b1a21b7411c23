# Device job (run by .devbin/run.sh; carry .devbin): issue 18's stage-1 / scan overlap
# (ALLOY_GDN_OVERLAP=P, b5a9899, off by default; never run on a GPU before this job). Binaries:
# main's gdn_cuda_bench and test_cuda (xz'd in .devbin, lib/*.so beside). ~3-4 min of run.
# Prints each arm's hash (must equal ov 0's) and op time; stops at the first run that hangs (40 s);
# CudaGdn* includes CudaGdnFusedChunked.OverlappedStageOneGivesTheChainScansBits.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "GPU: $name"
B=gdn_cuda_bench
run() { local ov=$1; shift
  ALLOY_GDN_OVERLAP=$ov timeout -s KILL 40 $B --prefill --gate-only --hash "$@" > /tmp/o.txt 2>&1; local rc=$?
  echo "ov $ov $* (rc $rc): $(grep -E 'hash|rror|^\| *[0-9]' /tmp/o.txt | cut -d'|' -f1-6 | tr '\n' ' ')"; return $rc; }
run 0 --t 4100 --hv 16 --bv 16 --segments 1; run 50 --t 4100 --hv 16 --bv 16 --segments 1 || exit 1
for ov in 0 50 0 50; do run $ov --t 32768 --hv 32 || exit 1; run $ov --t 16384 --hv 16 --bv 16 --segments 1 || exit 1; done
for ov in 30 40 65 80; do run $ov --t 32768 --hv 32; done
# P swept at T 4096 and 65536 (H_v 32: 128 chain blocks; H_v 48 has 192, more than the SMs: no overlap)
for ov in 0 35 50 65; do run $ov --t 4096 --hv 32; run $ov --t 65536 --hv 32; done
ALLOY_GDN_OVERLAP=50 timeout -s KILL 50 test_cuda --gtest_filter='CudaGdn*' 2>&1 | tail -3
