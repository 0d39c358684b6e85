# The thirty-eighth session's device call (RESULTS.md, "Thirty-eighth session"): the whole GPU suite at the 37th
# session's last commit (06fc342: the 9,000-row cross-entropy case, the 30-step knob test, the shared module-contents
# check, never yet run on a GPU). The bench and the speedrun are left out (their code is that of the 37th session's
# call 2): failed starts had spent all but ~480 s of the device time. No kernel cache to carry (a fresh checkout):
# the warm stage compiles every module first.
set -o pipefail
STAGES="warm tests" T_TESTS=270 \
  bash benchmarks/gpu_session.sh 2>&1 | tail -45
