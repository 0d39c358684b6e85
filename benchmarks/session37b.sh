# The thirty-seventh session's second device call (RESULTS.md, "Thirty-seventh session", call 2):
# - TILE_ARRANGE's threshold counted per SM (conv.py _tile_arranges, TILE_ARRANGE_MIN_COPIES 16: LeNet-5 b64's second
#   layer no longer arranged; b512's and MnistCnn's plans unchanged);
# - conv.cu's _arr instances as a module of their own (loader._PARTS, ST_ARRANGED), compiled when first asked for.
# The tests of the module parts and of the arranged weights, the bench beside torch's reduce-overhead mode, the
# speedrun, and the captured step of 129e614 (.ab_head, the threshold per thread) as "base" beside this tree, three
# rounds. Call 1's kernel cache is carried (.kcache.tgz.partaa, partab; conv.cu's modules compile again).
K=smalltrain.backend.cuda.conv
set -o pipefail
STAGES="warm tests compile speedrun ab" T_TESTS=150 T_COMPILE=150 AB_BASE=.ab_head AB_ROUNDS="1 2 3" \
  TESTS="tests/cuda/test_kernels.py tests/cuda/test_kernel_sources.py tests/testing/test_launch_plans.py" \
  PYTEST_ADDOPTS="-k 'module or part or arranged or weight_runs or tile_conv'" \
  COMPILE_MODES="smalltrain-compiled torch-reduce-overhead" AB="$K.TILE_VEC_STAGE_8=True" \
  bash benchmarks/gpu_session.sh 2>&1 | tail -40
