# The thirty-eighth session's last device try (RESULTS.md, "Thirty-eighth session"): with ~280 s of device time left
# after failed starts, not the whole suite (session38.sh) but the GPU tests that changed since the last whole-suite
# run (129e614): the one-launch cross-entropy at 9,000 rows, the weight-staging and module-contents helpers, the
# captured step's 30-step knob test and the 100-step captured-vs-eager equality, the flat-parameter steps. No warm
# stage: each worker compiles what it uses.
set -o pipefail
STAGES="tests" T_TESTS=150 \
  TESTS="tests/cuda/test_kernels.py tests/cuda/test_kernel_sources.py tests/test_compile.py" \
  PYTEST_ADDOPTS="-k 'one_launch or module or staging or arranged_weights or weight_runs or first_layers_rows or flat_parameters or 100_steps'" \
  bash benchmarks/gpu_session.sh 2>&1 | tail -30
