# The first device call the thirty-fourth session leaves to the next one (its device time ran out): the kernels
# compiled (common.cuh changed after the carried .kcache.tgz, ~140 s; the new cache was over the device tool's return
# limit), the tests mended after the thirty-fourth session's last GPU suite (they assumed the old staging and bias
# defaults) with the rest of the tile tests, the SASS of LeNet-5 b512's critical kernel (tile_conv_unpool_wgrad,
# whose epilogue held 53% of its warp samples) and the bench beside torch's reduce-overhead mode.
STAGES="warm tests source compile" T_TESTS=150 T_COMPILE=100 \
  TESTS="tests/cuda/test_kernels.py tests/cuda/test_kernel_sources.py tests/testing/test_launch_plans.py" \
  PYTEST_ADDOPTS="-k 'tile or conv or wgrad or plans or launch'" \
  NCU_DETAIL_CONFIGS=lenet5:512 NCU_DETAIL_KERNELS=unpool_wgrad \
  COMPILE_MODES="smalltrain-compiled torch-reduce-overhead" bash benchmarks/gpu_session.sh 2>&1 | tail -40
