# The thirty-second session's one device call: the tests its changes touch, an A/B of flattened parameters
# (bench.FLAT_PARAMETERS) on the captured step, and the bench beside torch's reduce-overhead mode.
STAGES="warm tests" WARM_DTYPES="1 2" T_TESTS=${T_TESTS:-200} \
  TESTS="tests/test_compile.py tests/cuda tests/nn/test_flat_parameters.py tests/optim tests/autograd tests/distributed/test_ddp.py" \
  bash benchmarks/gpu_session.sh 2>&1 | tail -12
export CUPY_CACHE_DIR=$PWD/.kcache CUPY_TF32=0 PYTHONUNBUFFERED=1
for f in False True; do echo "FLAT_PARAMETERS=$f"
  timeout 70 python3 benchmarks/bench_compile.py --modes smalltrain-compiled --no-torch \
    --set smalltrain.bench.FLAT_PARAMETERS=$f 2>&1 | sed -n '/^model:batch/,$p'
done | tee "$OUT/ab_flat.txt"
timeout 150 python3 -m smalltrain bench --device cuda --modes smalltrain-compiled torch-reduce-overhead \
  > "$OUT/bench_ro.txt" 2>&1; sed -n '/^model:batch/,$p' "$OUT/bench_ro.txt"
