#!/usr/bin/env bash
# Check smalltrain on a GPU machine: the test suite with its CUDA cases on the device, then `smalltrain bench`
# (throughput beside PyTorch eager and its whole step captured by hand, torch's strongest mode for these steps) and
# the speedrun.
#
# Run from anywhere: bash benchmarks/gpu_check.sh [pytest paths and options]   (default: the whole suite, tests/)
# OUT: the folder for the logs (default ./gpu_check_logs): env.txt, pytest.log, bench.txt, speedrun.txt.
# TEST_WORKERS: pytest-xdist workers where pytest-xdist is installed (default 8). Exit status: pytest's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_check_logs}
mkdir -p "$OUT"
# float32 throughout (no TF32 in CuPy's own GEMMs either); NVLink multicast off for the NCCL tests
export CUPY_TF32=0 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
PY=${PYTHON:-python3}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import sys, numpy, cupy, torch; print('python', sys.version.split()[0], 'numpy', numpy.__version__,
'cupy', cupy.__version__, 'cuda runtime', cupy.cuda.runtime.runtimeGetVersion(), 'torch', torch.__version__)"
} 2>&1 | tee "$OUT/env.txt"

workers=()
"$PY" -c "import xdist" 2>/dev/null && workers=(-n "${TEST_WORKERS:-8}")
[ $# -eq 0 ] && set -- tests
"$PY" -m pytest -q -rfE -p no:cacheprovider --durations=10 ${workers[@]+"${workers[@]}"} "$@" > "$OUT/pytest.log" 2>&1
rc=$?
tail -1 "$OUT/pytest.log"

"$PY" -m smalltrain bench --device cuda --modes smalltrain-eager smalltrain-compiled torch-eager \
    torch-graph > "$OUT/bench.txt" 2>&1
sed -n '/^model:batch/,$p' "$OUT/bench.txt"
for seed in 0 1 2; do
    "$PY" -m smalltrain bench --speedrun --device cuda --seed "$seed" 2>&1 | grep -E "^(speedrun|reached|did not)"
done | tee "$OUT/speedrun.txt"
exit "$rc"
