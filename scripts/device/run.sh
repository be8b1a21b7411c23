#!/usr/bin/env bash
# Device-call wrapper: copy it to .devbin/ beside the xz-compressed binaries and lib/*.so, with
# .devbin/source_dir holding the build's source path (`echo "$PWD" > .devbin/source_dir` in the
# repo root: the tests' compiled-in ALLOY_SOURCE_DIR), then run
# `bash .devbin/run.sh .devbin/JOB.sh` there. Unpacks the binaries into /tmp/bin, puts the
# libraries on the path and links the source path to this tree when it is missing.
set -u
mkdir -p /tmp/bin
for f in .devbin/*.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); chmod +x /tmp/bin/$(basename "$f" .xz); done
export LD_LIBRARY_PATH=$PWD/.devbin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/tmp/bin:$PATH
if [ -f .devbin/source_dir ]; then
  src=$(cat .devbin/source_dir)
  if [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
fi
bash "$@"
