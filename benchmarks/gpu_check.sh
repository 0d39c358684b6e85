#!/usr/bin/env bash
# Check smalltrain on a GPU machine, in stages (STAGES, default all, in this order):
#   tests        the test suite with its CUDA cases on the device (the float64 kernel modules, which ship
#                uncompiled, compiled first, all at once, so that the workers do not each compile them)
#   first-steps  seconds from process start to the first finished step of every zoo model (batch 64, eager and
#                compiled) and of `smalltrain train` (eager and --compile), each from an empty kernel cache
#   zoo          `smalltrain bench --zoo` beside PyTorch eager (also with TF32) and its whole step captured by
#                hand, torch's strongest mode for these steps
#   bench        the default bench configs beside the same torch modes
#   speedrun     time to 99.0% test accuracy, three seeds
#
# Run from anywhere: bash benchmarks/gpu_check.sh [pytest paths and options]   (default: the whole suite, tests/)
# e.g. STAGES="tests" bash benchmarks/gpu_check.sh, then STAGES="first-steps zoo" bash benchmarks/gpu_check.sh
# OUT: the folder for the logs (default ./gpu_check_logs): env.txt, compile_f64.txt, pytest.log, first_steps.txt,
# zoo.txt, bench.txt, speedrun.txt. TEST_WORKERS: pytest-xdist workers where it is installed (default 8).
# Exit status: pytest's where the tests ran, else 0.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_check_logs}
STAGES=${STAGES:-tests first-steps zoo bench speedrun}
mkdir -p "$OUT"
# float32 throughout (no TF32 in CuPy's own GEMMs either); NVLink multicast off for the NCCL tests
export CUPY_TF32=0 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
PY=${PYTHON:-python3}
rc=0
has() { [[ " $STAGES " == *" $1 "* ]]; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import sys, numpy, cupy, torch; print('python', sys.version.split()[0], 'numpy', numpy.__version__,
'cupy', cupy.__version__, 'cuda runtime', cupy.cuda.runtime.runtimeGetVersion(), 'torch', torch.__version__)"
} 2>&1 | tee "$OUT/env.txt"

if has tests; then
    "$PY" - > "$OUT/compile_f64.txt" 2>&1 <<'EOF'
import subprocess, sys, time
from smalltrain.backend.cuda import loader
start = time.time()
code = "import sys; from smalltrain.backend.cuda import loader; loader.compile_module(loader.family_source(sys.argv[1], 2))"
jobs = {f: subprocess.Popen([sys.executable, "-c", code, f]) for f in loader.families()}
for family, job in jobs.items():
    print(f"{family}: exit {job.wait()} at {time.time() - start:.0f} s")
EOF
    tail -1 "$OUT/compile_f64.txt"
    workers=()
    "$PY" -c "import xdist" 2>/dev/null && workers=(-n "${TEST_WORKERS:-8}")
    [ $# -eq 0 ] && set -- tests
    "$PY" -m pytest -q -rfE -p no:cacheprovider --durations=10 ${workers[@]+"${workers[@]}"} "$@" \
        > "$OUT/pytest.log" 2>&1
    rc=$?
    tail -1 "$OUT/pytest.log"
fi

if has first-steps; then
    for model in lenet5 cnn mlp examples-net bn-cnn strided mlp-dropout lenet-classic; do
        CUPY_CACHE_DIR=$(mktemp -d) "$PY" -m smalltrain bench --first-step --device cuda --config "$model:64" \
            --no-torch 2>&1 | grep -E "^first step"
    done | tee "$OUT/first_steps.txt"
    for flag in "" --compile; do
        log="$OUT/train${flag:+_compile}.txt"
        start=$(date +%s.%N)
        CUPY_CACHE_DIR=$(mktemp -d) "$PY" -m smalltrain train --device cuda --epochs 3 $flag --out "$(mktemp -d)" \
            > "$log" 2>&1
        echo "smalltrain train --device cuda $flag: exit $?, $(awk -v a="$start" -v b="$(date +%s.%N)" \
            'BEGIN{printf "%.1f", b - a}') s from process start to exit"
        grep -E "^smalltrain: (compil|CuPy)" "$log"
    done | tee -a "$OUT/first_steps.txt"
fi

torch_modes=(torch-eager torch-eager-tf32 torch-graph)
if has zoo; then
    "$PY" -m smalltrain bench --device cuda --zoo --modes smalltrain-eager smalltrain-compiled "${torch_modes[@]}" \
        > "$OUT/zoo.txt" 2>&1
    sed -n '/^model:batch/,$p' "$OUT/zoo.txt"
fi

if has bench; then
    "$PY" -m smalltrain bench --device cuda --modes smalltrain-eager smalltrain-compiled "${torch_modes[@]}" \
        > "$OUT/bench.txt" 2>&1
    sed -n '/^model:batch/,$p' "$OUT/bench.txt"
fi

if has speedrun; then
    for seed in 0 1 2; do
        "$PY" -m smalltrain bench --speedrun --device cuda --seed "$seed" 2>&1 | grep -E "^(speedrun|reached|did not)"
    done | tee "$OUT/speedrun.txt"
fi
exit "$rc"
