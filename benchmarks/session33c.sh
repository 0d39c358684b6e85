# The thirty-third session's last device call: the tests of the new tile_conv plan (_TILE_MIN_THREADS = 256) and of the
# removed _TILE_WG_FILL, the new default against the old one (gpu_session.sh's ab stage, AB_ROUNDS alternating; MORE_AB:
# more settings), the bench beside torch's reduce-overhead mode.
K=smalltrain.backend.cuda.conv
STAGES="tests ab compile" T_TESTS=${T_TESTS:-60} T_COMPILE=${T_RO:-100} COMPILE_MODES="smalltrain-compiled torch-reduce-overhead" \
  TESTS="tests/cuda/test_kernels.py tests/cuda/test_kernel_sources.py" PYTEST_ADDOPTS="-k 'tile or conv or wgrad'" \
  AB="$K._TILE_MIN_THREADS=256 $K._TILE_MIN_THREADS=128 ${MORE_AB:-}" AB_ROUNDS="${AB_ROUNDS:-1 2 3}" \
  bash benchmarks/gpu_session.sh 2>&1 | tail -60
