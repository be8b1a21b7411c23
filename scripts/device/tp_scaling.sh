#!/usr/bin/env bash
# Issue 22 on a several-GPU device machine (nvidia-h200-x2 / x4 / x8), one call: the tensor- and
# expert-parallel tests, then bench tp 1 / 2 (/ ep 2) on the 0.8b and a 35b-a3b cut to 8 layers, and
# a profile of tp 2 (the all-reduce share). Run through .devbin/run.sh (binaries on PATH); it
# finds libnccl.so.2 in the image's PyTorch and keeps NVLink multicast off.
NCCL_LIB=$(python3 -c "import nvidia.nccl as n, os; print(os.path.join(list(n.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$NCCL_LIB
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L; nvidia-smi topo -m 2>&1 | head -4
mkdir -p build/share/alloy; tar -xJf testdata/default-model/alloy-default-kjv.tar.xz -C build/share/alloy
export ALLOY_SOURCE_DIR=$PWD
( alloy synth --preset 0.8b --dtype q8_0 -o /tmp/08.gguf > /tmp/s1.log 2>&1;
  alloy synth --preset 35b-a3b --layers 8 --dtype q8_0 -o /tmp/35.gguf > /tmp/s3.log 2>&1; touch /tmp/synth.done ) &
echo "=== TP/EP tests"; timeout 120 test_cuda --gtest_filter='*TensorParallel*:*ExpertParallel*' 2>&1 | grep -E "OK \]|FAILED|Failure|actual|what|PASSED" | head -40
while [ ! -e /tmp/synth.done ]; do sleep 2; done
B="alloy bench --backend cuda -r 2"
for a in "--tp 1" "--tp 2"; do echo "=== 0.8b q8_0 $a"; timeout 60 $B -m /tmp/08.gguf $a -p 512,4096 -n 128 2>&1 | grep -E "^\| q|rror"; done
for a in "--tp 1" "--tp 2" "--ep 2"; do echo "=== 35b-a3b 8L q8_0 $a"; timeout 60 $B -m /tmp/35.gguf $a -p 4096 -n 128 2>&1 | grep -E "^\| q|rror"; done
echo "=== profile 0.8b tp 2"; timeout 60 alloy profile -m /tmp/08.gguf --backend cuda --tp 2 -p 4096 -n 16 2>&1 | head -25
for a in "--tp 1" "--tp 2"; do echo "=== 0.8b q8_0 batched $a"; timeout 90 alloy batched-bench -m /tmp/08.gguf --backend cuda $a --npp 128 --ntg 32 --npl 1,32 -c 8192 2>&1 | grep -E "^\||rror"; done
