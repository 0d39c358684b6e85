# The thirty-eighth session's last device try (RESULTS.md, "Thirty-eighth session"): with ~280 s of device time left
# after failed starts, not the whole suite (session38.sh) but the GPU tests that changed since the last whole-suite
# run (129e614): the one-launch cross-entropy at 9,000 rows, the weight-staging and module-contents helpers, the
# captured step's 30-step knob test and the 100-step captured-vs-eager equality, the flat-parameter steps. No warm
# stage: each worker compiles what it uses.
set -o pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUPY_TF32=0
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import cupy, torch, numpy; print('cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
} 2>&1 | tee "$OUT/env.txt"
timeout ${T_TESTS:-150} python3 -m pytest -v -p no:cacheprovider -n 8 --durations=5 \
  tests/cuda/test_kernels.py tests/cuda/test_kernel_sources.py tests/test_compile.py \
  -k "one_launch or module or staging or arranged_weights or weight_runs or first_layers_rows or flat_parameters or 100_steps" \
  > "$OUT/pytest.log" 2>&1
grep -oE "(FAILED|ERROR) tests/[^ ]+" "$OUT/pytest.log" | sort -u | head -20; tail -8 "$OUT/pytest.log"
