# The thirty-eighth session's device call (RESULTS.md, "Thirty-eighth session"): the whole GPU suite at the 37th
# session's last commit (06fc342: the 9,000-row cross-entropy case, the 30-step knob test, the shared module-contents
# check, never yet run on a GPU), then the bench beside torch's reduce-overhead mode. The speedrun is left out: its
# code is that of the 37th session's call 2, and failed starts had spent most of the device time: the stages' limits
# fit the ~500 s left. No kernel cache to carry (a fresh checkout): the warm stage compiles every module.
set -o pipefail
STAGES="warm tests compile" T_TESTS=280 T_COMPILE=110 \
  COMPILE_MODES="smalltrain-compiled torch-reduce-overhead" \
  bash benchmarks/gpu_session.sh 2>&1 | tail -45
