# The thirty-fifth session's last device call (RESULTS.md, "Thirty-fifth session", call 4): the weight staging loop
# of tile_conv unrolled by 4 (this tree then; uncommitted, dropped: no gain) beside 3a89371 (.ab_head: git archive
# 3a89371 smalltrain benchmarks ':!smalltrain/datasets/data'), three rounds; then, in .ab_head (3a89371), the graph
# replay's timeline of MnistCnn b64 and LeNet-5 b512 and the
# SASS of MnistCnn's tile kernels with warp-stall samples (the thirty-fourth session's pages predate the vector
# staging).
K=smalltrain.backend.cuda.conv
set -o pipefail
export CUPY_CACHE_DIR=$PWD/.kcache
STAGES="warm ab" WARM_DTYPES=1 AB_BASE=.ab_head AB_ROUNDS="1 2 3" AB="$K.TILE_VEC_STAGE_8=True" \
  bash benchmarks/gpu_session.sh 2>&1 | tail -40
(cd .ab_head && OUT=$OUT STAGES="timeline source" TIMELINE_CONFIGS="cnn:64 lenet5:512" NCU_DETAIL_CONFIGS=cnn:64 \
  NCU_DETAIL_KERNELS=tile_ bash benchmarks/gpu_session.sh 2>&1 | tail -40)
