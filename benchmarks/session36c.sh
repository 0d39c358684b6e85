# The thirty-sixth session's third device call (RESULTS.md, "Thirty-sixth session", call 3): tile_conv's weights
# arranged in its shared-memory layout by tile_arrange (conv.py TILE_ARRANGE, this tree) and staged 16 bytes a copy.
# Short: the session had under 300 s of device time left.
# 1. the float32 kernels compiled (conv.cu changed; .ab_head's beside them), the float32 tests of the arranged
#    weights and the weight runs (the 16-byte copies of the arranged layout run on a GPU only);
# 2. the captured step: .ab_head (014af2d, before this change) as "base", this tree (TILE_ARRANGE on,
#    TILE_ARRANGE_MIN_COPIES 8: MnistCnn's second layer and LeNet-5's at b512), three rounds.
K=smalltrain.backend.cuda.conv
set -o pipefail
STAGES="warm tests ab" WARM_DTYPES=1 T_TESTS=60 AB_BASE=.ab_head AB_ROUNDS="1 2 3" TESTS=tests/cuda/test_kernels.py \
  PYTEST_ADDOPTS="-k '(arranged or weight_runs) and float32'" AB="$K.TILE_ARRANGE=True" \
  bash benchmarks/gpu_session.sh 2>&1 | tail -30
