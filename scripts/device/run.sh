#!/usr/bin/env bash
# Device-call wrapper (copy to .devbin/ beside the xz-compressed binaries and lib/*.so): binaries to /tmp/bin, libraries on the path, the source tree where the
# tests' compiled-in ALLOY_SOURCE_DIR expects it, then the job script.
set -u
mkdir -p /tmp/bin
for f in .devbin/*.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); chmod +x /tmp/bin/$(basename "$f" .xz); done
export LD_LIBRARY_PATH=$PWD/.devbin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/tmp/bin:$PATH
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$PWD" /work/main; fi
bash "$@"
