# The thirty-seventh session's first device call (RESULTS.md, "Thirty-seventh session", call 1), at 129e614 (the
# arranged staging as instances of their own, ARR): the whole GPU suite (no GPU had run the ARR instances), then the
# captured step of 014af2d (.ab_base, before TILE_ARRANGE) as "base" beside this tree with TILE_ARRANGE on and off,
# three rounds. The kernel cache of 014af2d is carried (.kcache.tgz.partaa, partab) and this tree's is packed back
# (KCACHE_OUT=1) for call 2.
K=smalltrain.backend.cuda.conv
set -o pipefail
STAGES="warm tests ab" T_TESTS=300 AB_BASE=.ab_base AB_ROUNDS="1 2 3" KCACHE_OUT=1 \
  AB="$K.TILE_ARRANGE=True $K.TILE_ARRANGE=False" bash benchmarks/gpu_session.sh 2>&1 | tail -45
