# The thirty-sixth session's second device call (RESULTS.md, "Thirty-sixth session", call 2), at 014af2d
# (TILE_WEIGHT_RUN = 4): the whole GPU suite, the bench beside torch's reduce-overhead mode, the speedrun, and the
# captured step beside a probe tree (.ab_probe: 014af2d with tile_conv's weights not copied but zeroed by 16-byte
# shared stores, uncommitted; wrong values, right timing) that bounds what staging the weights by 16-byte copies
# (an arranged copy of w, not built) could save, three rounds. The kernel cache from call 1 is carried
# (.kcache.tgz.partaa, partab).
K=smalltrain.backend.cuda.conv
set -o pipefail
STAGES="warm tests compile speedrun ab" T_TESTS=420 T_COMPILE=150 AB_BASE=.ab_probe AB_ROUNDS="1 2 3" \
  COMPILE_MODES="smalltrain-compiled torch-reduce-overhead" AB="$K.TILE_VEC_STAGE_8=True" \
  bash benchmarks/gpu_session.sh 2>&1 | tail -40
