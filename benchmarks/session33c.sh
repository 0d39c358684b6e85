# The thirty-third session's last device call, left to the next session (the device time ran out): the kernels
# compiled (every module changed after the carried .kcache.tgz: tile_wgrad's WB, common.cuh; ~2 min, and
# KCACHE_OUT=1 returns the new cache as kcache.tgz, to be carried as .kcache.tgz), the tests of the new tile_conv plan
# (_TILE_MIN_THREADS = 256), of the removed _TILE_WG_FILL and of tile_wgrad without bias threads, then an A/B
# (gpu_session.sh's ab stage, AB_ROUNDS alternating; MORE_AB: more settings) of the new default against the old one
# and of TILE_WG_BIAS_SPREAD, then the bench beside torch's reduce-overhead mode.
K=smalltrain.backend.cuda.conv
STAGES="warm tests ab compile" KCACHE_OUT=1 T_TESTS=${T_TESTS:-120} T_COMPILE=${T_RO:-100} \
  COMPILE_MODES="smalltrain-compiled torch-reduce-overhead" \
  TESTS="tests/cuda/test_kernels.py tests/cuda/test_kernel_sources.py" PYTEST_ADDOPTS="-k 'tile or conv or wgrad'" \
  AB="$K._TILE_MIN_THREADS=256 $K._TILE_MIN_THREADS=128 $K.TILE_WG_BIAS_SPREAD=True ${MORE_AB:-}" \
  AB_ROUNDS="${AB_ROUNDS:-1 2 3}" bash benchmarks/gpu_session.sh 2>&1 | tail -70
