# The thirty-third session's first device call: the tests of the commits not yet run on a GPU (the aligned flat
# buffers, the identity map, _TILE_WG_FILL's plans, the wgrad-first rule), then an A/B of the captured step under the untimed knobs,
# three rounds alternating, then the bench beside torch's reduce-overhead mode.
export CUPY_CACHE_DIR=$PWD/.kcache CUPY_TF32=0 PYTHONUNBUFFERED=1
mkdir -p "$CUPY_CACHE_DIR" && [ -f .kcache.tgz ] && tar -xzf .kcache.tgz -C "$CUPY_CACHE_DIR"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import cupy, torch, numpy; print('cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
} 2>&1 | tee "$OUT/env.txt"
timeout ${T_TESTS:-150} python3 -m pytest -q -p no:cacheprovider -n 8 tests/nn/test_flat_parameters.py \
  tests/test_compile.py tests/test_identity_map.py tests/distributed/test_ddp.py \
  "tests/cuda/test_kernels.py" -k "flat or tile_wgrad or filling or identity or bucket or compile or ddp or beside or wgrad_first" \
  > "$OUT/pytest.log" 2>&1; grep -oE "(FAILED|ERROR) tests/[^ ]+" "$OUT/pytest.log" | sort -u | head; tail -1 "$OUT/pytest.log"
K=smalltrain.backend.cuda.conv
for round in 1 2 3; do
  for s in base "$K._TILE_WG_FILL=True" "smalltrain.bench.FLAT_PARAMETERS=True" \
           "$K.WGRAD_ON_MAIN=True" \
           "$K.WGRAD_FIRST_MAX_AREA_RATIO=1.5 $K._TILE_WG_FILL=True"; do
    sets=""; [ "$s" != base ] && for x in $s; do sets="$sets --set $x"; done
    echo "round $round: $s"
    timeout 60 python3 benchmarks/bench_compile.py --modes smalltrain-compiled --no-torch $sets 2>&1 \
      | sed -n '/^model:batch/,$p'
  done
done | tee "$OUT/ab.txt"
timeout ${T_RO:-150} python3 -m smalltrain bench --device cuda --modes smalltrain-compiled torch-reduce-overhead \
  > "$OUT/bench_ro.txt" 2>&1; sed -n '/^model:batch/,$p' "$OUT/bench_ro.txt"
