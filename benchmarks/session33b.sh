# The thirty-third session's second device call: ncu's sections for the kernels on LeNet-5 b512's and MnistCnn b64's
# critical paths (the first call's timeline), then an A/B of the captured step under knobs of those kernels' plans
# that earlier sessions tuned on other code, and _TILE_WG_FILL with its KS - 1 rows at least (three rounds alternating).
export CUPY_CACHE_DIR=$PWD/.kcache CUPY_TF32=0 PYTHONUNBUFFERED=1
mkdir -p "$CUPY_CACHE_DIR" && [ -f .kcache.tgz ] && tar -xzf .kcache.tgz -C "$CUPY_CACHE_DIR"
STAGES=detail NCU_DETAIL_CONFIGS="lenet5:512 cnn:64" T_DETAIL=150 \
  NCU_DETAIL_KERNELS="tile_conv_pool|chain_fwd_ce|chain_bwd|chain_wgrad|tile_wgrad|tile_conv_unpool_wgrad|tile_conv_wgrad|tile_conv_lin" \
  bash benchmarks/gpu_session.sh > "$OUT/detail_summary.txt" 2>&1; tail -c 5000 "$OUT/detail_summary.txt"
K=smalltrain.backend.cuda.conv L=smalltrain.backend.cuda.linear
for round in 1 2 3; do
  for s in base "$K._TILE_WG_FILL=True" "$L._CHAIN_ROWS=(8,)" "$L._CHAIN_ROWS=(2,)" "$K._TILE_BLOCKS_PER_SM=4" \
           "$K._TILE_MIN_THREADS=256" "$K._TILE_WG_BLOCKS_PER_SM=2" "$L.CHAIN_WGRAD_BESIDE=False"; do
    sets=""; [ "$s" != base ] && for x in $s; do sets="$sets --set $x"; done
    echo "round $round: $s"
    timeout 60 python3 benchmarks/bench_compile.py --modes smalltrain-compiled --no-torch \
      $sets 2>&1 | sed -n '/^lenet5\|^cnn\|Error/p'
  done
done | tee "$OUT/ab.txt"
