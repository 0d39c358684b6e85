#!/usr/bin/env bash
# One device-machine call: the CUDA half of the test suite, then `smalltrain bench` (throughput beside PyTorch),
# the host-time profile of an eager step, the speedrun and a CUDA training run of the trainer (eager, --compile).
# Logs under $OUT (the device tool's output folder; ./gpu_out elsewhere). Each stage has its own time limit;
# TORCH_COMPILE=1 adds torch.compile's modes to the table (slow to compile).
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUPY_TF32=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import cupy, torch, numpy; print('cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"; } 2>&1 | tee "$OUT/env.txt"
timeout ${T_TESTS:-200} python3 -m pytest -q -p no:cacheprovider -n 8 --durations=10 -k "cuda or nccl or compile" tests \
  > "$OUT/pytest_cuda.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/pytest_cuda.log" | head -40; tail -2 "$OUT/pytest_cuda.log"
tc=--no-torch-compile; [ "${TORCH_COMPILE:-0}" = 1 ] && tc=
timeout ${T_BENCH:-150} python3 -m smalltrain bench --device cuda $tc 2>&1 | tee "$OUT/bench.txt"
timeout 60 python3 benchmarks/profile_step.py --device cuda --config lenet5:64 > "$OUT/profile.txt" 2>&1; head -45 "$OUT/profile.txt"
timeout ${T_SPEEDRUN:-120} python3 -m smalltrain bench --speedrun ${SPEEDRUN_ARGS:-} 2>&1 | tail -30 | tee "$OUT/speedrun.txt"
for mode in "" "--compile"; do
  timeout 90 python3 -m smalltrain train --device cuda $mode --epochs 1 --log-every 200 --out /tmp/run$mode 2>&1 | tail -3
done | tee "$OUT/train_cuda.txt"
