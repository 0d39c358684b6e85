# The thirty-sixth session's first device call (RESULTS.md, "Thirty-sixth session", call 1): tile_conv's weights
# staged by runs of consecutive taps (conv.py TILE_WEIGHT_RUN, _tile_weight_run).
# 1. the kernels compiled (conv.cu changed: its modules anew, the rest from the carried cache), the tile, conv, wgrad,
#    unpool, plans and launch tests (test_tile_conv_weight_runs_are_bit_equal among them);
# 2. the captured step with runs of at most 1 (tap by tap, as before), 4 and 8, and with TILE_LINEAR_HOLD on (runs
#    of 1: MnistCnn's cross-entropy in tile_conv_lin, last measured in the twenty-eighth session), three rounds;
# then the kernel cache in parts (KCACHE_OUT) for the next call.
K=smalltrain.backend.cuda.conv
set -o pipefail
STAGES="warm tests ab" T_TESTS=200 AB_ROUNDS="1 2 3" KCACHE_OUT=1 \
  TESTS="tests/cuda/test_kernels.py tests/cuda/test_kernel_sources.py tests/testing/test_launch_plans.py" \
  PYTEST_ADDOPTS="-k 'tile or conv or wgrad or plans or launch or unpool or pooled'" \
  AB="$K.TILE_WEIGHT_RUN=1 $K.TILE_WEIGHT_RUN=4 $K.TILE_WEIGHT_RUN=8 $K.TILE_LINEAR_HOLD=True" bash benchmarks/gpu_session.sh 2>&1 | tail -40
