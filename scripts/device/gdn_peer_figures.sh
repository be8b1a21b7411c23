# Device job (run by .devbin/run.sh, which unpacks .devbin/*.xz onto PATH; carry .devbin and .whl):
# issue 18's GDN figures on whatever GPU comes (the targets are stated on the H200; compare only
# within one call): the fused decode step (B = 1, 32), the chunked op at T 4096 and FlashQLA's
# published shapes, fla 0.6.0 at T 512 / 4096 in the same call. Binary: gdn_cuda_bench (main).
# ~90 s of run; the full table: `gdn_cuda_bench --prefill --gate-only --tmax 65536` and
# `scripts/gdn_fla_peer.py /tmp/cases --tmax 65536` + `gdn_cuda_bench --check-chunked /tmp/cases`.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "GPU: $name"
for b in 1 32; do timeout 30 gdn_cuda_bench --decode --b $b 2>&1 | grep -E "^\| *[0-9]"; done
for s in "4096 16" "4096 32" "4096 48" "8192 16" "32768 32" "32768 48"; do set -- $s
  echo "$1 $2: $(timeout 40 gdn_cuda_bench --prefill --gate-only --t $1 --hv $2 2>&1 | grep -E '^\| *[0-9]' | cut -d'|' -f2-7)"; done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site timeout 120 python3 scripts/gdn_fla_peer.py /tmp/cases --tmax 4096 2>&1 | tail -9
