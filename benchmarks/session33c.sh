# The thirty-third session's last device call: the tests of the new tile_conv plan (_TILE_MIN_THREADS = 256) and of the
# removed _TILE_WG_FILL, the new default against the old one (ROUNDS, default three, alternating; MORE_AB: more
# settings, e.g. "$K._TILE_SPLIT_THREADS_PER_SM=2048"), the bench beside torch.
export CUPY_CACHE_DIR=$PWD/.kcache CUPY_TF32=0 PYTHONUNBUFFERED=1
mkdir -p "$CUPY_CACHE_DIR" && [ -f .kcache.tgz ] && tar -xzf .kcache.tgz -C "$CUPY_CACHE_DIR"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import cupy, torch, numpy; print('cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
} 2>&1 | tee "$OUT/env.txt"
timeout ${T_TESTS:-60} python3 -m pytest -q -p no:cacheprovider -n 8 tests/cuda/test_kernels.py \
  tests/cuda/test_kernel_sources.py -k "tile or conv or wgrad" > "$OUT/pytest.log" 2>&1
grep -oE "(FAILED|ERROR) tests/[^ ]+" "$OUT/pytest.log" | sort -u | head; tail -1 "$OUT/pytest.log"
K=smalltrain.backend.cuda.conv
for round in ${ROUNDS:-1 2 3}; do
  for s in base "$K._TILE_MIN_THREADS=128" ${MORE_AB:-}; do
    sets=""; [ "$s" != base ] && sets="--set $s"
    echo "round $round: $s"
    timeout 60 python3 benchmarks/bench_compile.py --modes smalltrain-compiled --no-torch $sets 2>&1 \
      | sed -n '/^lenet5\|^cnn\|Error/p'
  done
done | tee "$OUT/ab.txt"
timeout ${T_RO:-100} python3 -m smalltrain bench --device cuda --modes smalltrain-compiled torch-reduce-overhead \
  > "$OUT/bench_ro.txt" 2>&1; sed -n '/^model:batch/,$p' "$OUT/bench_ro.txt"
