# The thirty-fifth session's first device call (RESULTS.md, "Thirty-fifth session", call 1). This tree was 3a89371
# with tile_conv's weight staging loops and common.cuh st_stage_window's loop unrolled by 4 (`#pragma unroll 4`,
# uncommitted, dropped after this call: it lost). Trees beside it (untracked, made by
#   git archive REV smalltrain benchmarks ':!smalltrain/datasets/data' | tar -x -C DIR):
#   .ab_base  ab2f61c (the thirty-fourth session's end);
#   .ab_head  3a89371 (st_stage_window; tile_conv_unpool_wgrad's spread epilogue), the tree without the unrolling.
# 1. the kernels compiled (both trees' float32 beside this tree's two types), the tile, conv, wgrad, unpool, plans
#    and launch tests (the tests mended after the thirty-fourth session's last GPU suite among them);
# 2. the captured step beside ab2f61c, then beside 3a89371 (the setting "base" each time; the other setting is a
#    knob at its default value, i.e. this tree as it is);
# then the kernel cache in parts (KCACHE_OUT) for the next call.
K=smalltrain.backend.cuda.conv
set -o pipefail
# .ab_head's float32 kernels compiled beside the first call's warm stage (the same cache; gpu_session.sh's default)
export CUPY_CACHE_DIR=$PWD/.kcache
(cd .ab_head && for f in smalltrain/backend/cuda/kernels/*.cu; do timeout 300 python3 -c "import os, sys
from smalltrain.backend.cuda import loader
loader.compile_module(loader.family_source(os.path.basename(sys.argv[1])[:-3], 1))" "$f" & done; wait) &
STAGES="warm tests ab" AB_BASE=.ab_base T_TESTS=200 \
  TESTS="tests/cuda/test_kernels.py tests/cuda/test_kernel_sources.py tests/testing/test_launch_plans.py" \
  PYTEST_ADDOPTS="-k 'tile or conv or wgrad or plans or launch or unpool or pooled'" \
  AB="$K.TILE_VEC_STAGE_8=True" bash benchmarks/gpu_session.sh 2>&1 | tail -30
mv "${OUT:-gpu_out}/ab.txt" "${OUT:-gpu_out}/ab_ab2f61c.txt"
wait   # (.ab_head's kernels)
STAGES="ab" AB_BASE=.ab_head KCACHE_OUT=1 AB="$K.TILE_VEC_STAGE_8=True" bash benchmarks/gpu_session.sh 2>&1 | tail -20
