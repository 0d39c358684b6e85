#!/usr/bin/env bash
# One device-machine call: the whole test suite on the GPU machine, its NCCL tests again with their output,
# `smalltrain bench` (throughput beside PyTorch eager, then torch.compile's two modes), the speedrun (default
# recipe, three seeds), the trainer on CUDA (eager and --compile, one epoch each), the per-kernel GPU time of
# LeNet-5 b64/b512 and MnistCnn b64 steps (ncu) and the host cost of the primitives an eager step is made of
# (benchmarks/host_costs.py), and a cProfile of the eager step's host side (benchmarks/profile_step.py).
# Logs under $OUT (the device tool's output folder; ./gpu_out elsewhere). Each stage has its own time limit;
# STAGES picks stages (e.g. STAGES="warm tests bench ncu") so that one session's device time can be split over calls;
# warm (first) compiles every kernel file before anything times or tests them.
# COMPILE_MODES: the compile stage's modes (e.g. "smalltrain-compiled torch-reduce-overhead": ours beside the best torch
# mode in one process, where device time is short).
# TESTS narrows the test stage to some paths (default: the whole suite), TEST_WORKERS sets its pytest-xdist workers
# (default 8), NCU_CONFIGS the ncu stage's model:batch list.
# The variants stage (not in the default STAGES): benchmarks/conv_variants.py with VARIANT_ARGS (default --pooled).
# The timeline stage (not in the default STAGES): the graph replay's kernels as they overlap (CUPTI).
# The detail stage (not in the default STAGES): ncu's sections per kernel of NCU_DETAIL_CONFIGS' steps (only the
# kernels whose names match the regex NCU_DETAIL_KERNELS, where set); the source stage: those kernels' SASS with
# each instruction's warp-stall samples.
# The ab stage (not in the default STAGES) times the captured step under each setting of AB, space-separated
# settings of comma-separated MODULE.NAME=VALUE knobs (e.g. AB="$K.INTO_POOLED=False $K.INTO_POOLED=True" with
# K=smalltrain.backend.cuda.conv), rounds alternating (AB_ROUNDS, default "1 2"), on AB_CONFIGS (default lenet5:64
# lenet5:512 cnn:64);
# with AB_BASE (below) the code before a change as the setting "base" first.
# KCACHE_OUT=1 packs the compiled kernels into $OUT/kcache.tgz.partaa, ab, ...; carried back as .kcache.tgz.partaa, ...
# a later call's warm stage takes seconds instead of ~2 minutes (below).
set -u
STAGES=" ${STAGES:-warm tests nccl bench compile speedrun train ncu host profile} "
stage() { [[ $STAGES == *" $1 "* ]]; }
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUPY_TF32=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
command -v ncu >/dev/null || export PATH=$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | head -1)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import cupy, torch, numpy; print('cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"; } 2>&1 | tee "$OUT/env.txt"
# Every kernel file of the tree in DIR compiled into CuPy's disk cache as the loader compiles it (a module per element
# type, loader.family_source), one process per module: a cold cache made each of the ab stage's 120 s runs time out
# on a fresh H100 (nineteenth session, when conv.cu was one module of ~70 s in nvcc), and the test stage's workers
# would each wait on the same compiles.
warm_kernels() {   # DIR [ELEMENT TYPES: 1 float32, 2 float64; default both]
  local t0=$SECONDS
  # (each module part too, loader._PARTS: conv.cu's _arr instances; "-" the main module, all a tree before parts has)
  (cd "$1" && for f in smalltrain/backend/cuda/kernels/*.cu; do
    parts=$(python3 -c "import os, sys; from smalltrain.backend.cuda import loader
print(*(p or '-' for p in loader.family_parts(os.path.basename(sys.argv[1])[:-3])) if hasattr(loader, 'family_parts') else '-')" "$f")
    for d in ${2:-1 2}; do for p in $parts; do
    timeout 300 python3 -c "import os, sys; from smalltrain.backend.cuda import loader
part = [] if sys.argv[3] == '-' else [sys.argv[3]]
if hasattr(loader, 'family_source'): loader.compile_module(loader.family_source(os.path.basename(sys.argv[1])[:-3], int(sys.argv[2]), *part))
elif sys.argv[2] == '1': loader.compile_module(loader.read_source(sys.argv[1]))  # (a tree from before the split)" "$f" $d $p &
  done; done; done; wait)
  echo "kernels of $1 compiled in $((SECONDS - t0)) s"
}
# CuPy's disk cache of compiled kernels inside the tree (ignored by git), so that a later call can carry it (the device
# tool's `carry`) and skip the warm stage's ~130 s of NVRTC: the cache's keys hold the source, the
# options and NVRTC's version, so a stale or foreign entry is a miss, never a wrong kernel. KCACHE_OUT=1 packs it
# into $OUT/kcache.tgz.part* at the end (with what the other stages compiled), to be carried as .kcache.tgz.part*.
# A packed cache carried as .kcache.tgz (the first: 5.6 MB, against 31 MB unpacked) is unpacked first.
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.kcache}
# A cache over the device tool's 16 MiB a returned file comes back in parts, .kcache.tgz.partaa, ab, ...: carry them
# all (they are joined here in name order).
[ -f .kcache.tgz ] && mkdir -p "$CUPY_CACHE_DIR" && tar -xzf .kcache.tgz -C "$CUPY_CACHE_DIR"
ls .kcache.tgz.part* >/dev/null 2>&1 && mkdir -p "$CUPY_CACHE_DIR" && cat .kcache.tgz.part* | tar -xz -C "$CUPY_CACHE_DIR"
# WARM_DTYPES: the element types the warm stage compiles (default "1 2"; "1" where only benchmarks run, which are
# float32: half the compiles). With the ab stage and AB_BASE, the base tree's float32 modules compile beside them.
if stage warm; then
  stage ab && [ -n "${AB_BASE:-}" ] && { warm_kernels "$AB_BASE" 1 & }
  warm_kernels . "${WARM_DTYPES:-1 2}"; wait
fi
if stage tests; then
  # -v: every result is a line as it comes, so the failures are in the log even if the time limit cuts the run.
  # 420 s: the whole suite took 265 s on the H200 (13th session) and did not finish in 300 on an H100 (97%)
  timeout ${T_TESTS:-420} python3 -m pytest -v -p no:cacheprovider -n ${TEST_WORKERS:-8} --durations=10 ${TESTS:-tests} > "$OUT/pytest.log" 2>&1
  grep -oE "(FAILED|ERROR) tests/[^ ]+" "$OUT/pytest.log" | sort -u | head -20; tail -1 "$OUT/pytest.log"
fi
# the NCCL tests alone, their failures' output kept (two failed on an H100 in the eighteenth session, the reason cut
# off with the whole suite's log)
stage nccl && { timeout ${T_NCCL:-90} python3 -m pytest -q -p no:cacheprovider tests/distributed -k nccl > "$OUT/nccl.log" 2>&1
  tail -40 "$OUT/nccl.log"; }
# the whole output kept (the table's rows start after the header lines), its table printed
stage bench && { timeout ${T_BENCH:-100} python3 -m smalltrain bench --device cuda --no-torch-compile > "$OUT/bench.txt" 2>&1
  sed -n '/^model:batch/,$p' "$OUT/bench.txt"; }
stage compile && { timeout ${T_COMPILE:-200} python3 -m smalltrain bench --device cuda --modes ${COMPILE_MODES:-torch-compile torch-reduce-overhead} \
  > "$OUT/bench_torch_compile.txt" 2>&1; sed -n '/^model:batch/,$p' "$OUT/bench_torch_compile.txt"; }
stage speedrun && for seed in 0 1 2; do
  timeout 40 python3 -m smalltrain bench --speedrun --seed $seed 2>&1 | grep -E "^(speedrun|warm-up|eval|reached|did not)"
done | tee "$OUT/speedrun.txt"
stage train && for mode in "" "--compile"; do
  timeout 60 python3 -m smalltrain train --device cuda $mode --epochs 1 --log-every 200 --out /tmp/run$mode 2>&1 | tail -3
done | tee "$OUT/train_cuda.txt"
# NCU_BASE=1 (with AB_BASE): the base tree's kernels too, each config right after the tree's (kernels_base_*.txt).
# NCU_SETS: comma-separated MODULE.NAME=VALUE knobs for the tree's steps in the ncu, detail and source stages
# (kernel_times.py --set; an eager step, so e.g. smalltrain.backend.cuda._common.HOLD_EAGER=True for the kernels a
# captured step runs)
# knob_args NAME SETTING: the array NAME set to the --set arguments of SETTING's comma-separated knobs (the ab and ncu
# stages')
knob_args() {
  local -n args=$1; local knob knobs; args=()
  IFS=',' read -ra knobs <<< "$2"; for knob in "${knobs[@]}"; do args+=(--set "$knob"); done
}
knob_args ncu_sets "${NCU_SETS:-}"
stage ncu && for config in ${NCU_CONFIGS:-lenet5:64 lenet5:512 cnn:64}; do
  for tree in . ${NCU_BASE:+$AB_BASE}; do
    name=kernels_$([ "$tree" = . ] || echo base_)${config/:/_}.txt
    sets=(); [ "$tree" = . ] && sets=("${ncu_sets[@]}")
    # warm caches (--cache-control none), as in a replay where the step's few MB stay in L2
    (cd $tree && timeout 60 ncu --clock-control none --cache-control none --profile-from-start off --csv \
      --metrics gpu__time_duration.sum python3 benchmarks/kernel_times.py --config $config "${sets[@]}" \
      > /tmp/ncu.csv 2>/dev/null)
    python3 benchmarks/kernel_times.py --summarize /tmp/ncu.csv > "$OUT/$name" 2>&1
    echo "$name"; head -12 "$OUT/$name"
  done
done
# the captured step's replay as it runs (benchmarks/timeline.py, CUPTI through PyTorch's profiler; not in the
# default STAGES): each kernel's start and end on its stream and the time no kernel runs, for TIMELINE_CONFIGS
# (knobs: NCU_SETS)
stage timeline && for config in ${TIMELINE_CONFIGS:-lenet5:512 lenet5:64}; do
  name=timeline_${config/:/_}
  timeout ${T_TIMELINE:-120} python3 benchmarks/timeline.py --config $config --trace /tmp/$name.json \
    "${ncu_sets[@]}" > "$OUT/$name.txt" 2>&1
  head -40 "$OUT/$name.txt"
done
# ncu's sections for each kernel of one eager step (what a kernel waits on: occupancy, warp stalls, memory), for the
# kernels' next changes; not in the default STAGES (its replays take ~10 passes a kernel)
stage detail && for config in ${NCU_DETAIL_CONFIGS:-lenet5:512}; do
  timeout ${T_DETAIL:-120} ncu --clock-control none --cache-control none --profile-from-start off \
    ${NCU_DETAIL_KERNELS:+-k regex:$NCU_DETAIL_KERNELS} --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section SchedulerStats python3 benchmarks/kernel_times.py --config $config "${ncu_sets[@]}" \
    > "$OUT/ncu_detail_${config/:/_}.txt" 2>&1
  grep -E "^  [a-z_0-9]+ \(|Duration|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp Per Scheduler" \
    "$OUT/ncu_detail_${config/:/_}.txt" | head -80
done
# the SASS of the kernels matching NCU_DETAIL_KERNELS (required) in one step of each NCU_DETAIL_CONFIGS, each
# instruction with its executions and warp-stall samples (ncu's source page as CSV), to find where a kernel's time
# goes; not in the default STAGES
stage source && for config in ${NCU_DETAIL_CONFIGS:-lenet5:512}; do
  rep=/tmp/source_${config/:/_}
  timeout ${T_DETAIL:-120} ncu --clock-control none --cache-control none --profile-from-start off -f -o $rep \
    -k regex:${NCU_DETAIL_KERNELS:?the source stage needs NCU_DETAIL_KERNELS} --section SourceCounters \
    --section WarpStateStats --section SpeedOfLight python3 benchmarks/kernel_times.py --config $config \
    "${ncu_sets[@]}" > "$OUT/ncu_source_${config/:/_}.log" 2>&1
  ncu --import $rep.ncu-rep --page source --csv --print-source sass > "$OUT/sass_${config/:/_}.csv" 2>&1
  ncu --import $rep.ncu-rep --page details > "$OUT/source_details_${config/:/_}.txt" 2>&1
  wc -l "$OUT/sass_${config/:/_}.csv"; head -3 "$OUT/sass_${config/:/_}.csv" | cut -c1-400
done
# kernels against each other on one layer (benchmarks/conv_variants.py; not in the default STAGES): VARIANT_ARGS, by
# default the pooled layer's gradients two ways each on LeNet-5's second layer (--pooled)
stage variants && { timeout ${T_VARIANTS:-120} python3 benchmarks/conv_variants.py ${VARIANT_ARGS:---pooled} \
  > "$OUT/conv_variants.txt" 2>&1; tail -20 "$OUT/conv_variants.txt"; }
stage host && timeout 60 python3 benchmarks/host_costs.py > "$OUT/host_costs.txt" 2>&1
stage profile && for config in cnn:64 lenet5:64; do
  # the host side of an eager step: cProfile's top functions by own time, then by cumulative time
  timeout 60 python3 benchmarks/profile_step.py --device cuda --config $config --sort tottime --top 45 > "$OUT/profile_${config/:/_}.txt" 2>&1
  timeout 60 python3 benchmarks/profile_step.py --device cuda --config $config --sort cumtime --top 60 > "$OUT/profile_cum_${config/:/_}.txt" 2>&1
  head -5 "$OUT/profile_${config/:/_}.txt"
done
# AB_BASE: a folder inside the tree (so that it travels) holding the code to compare with, made by
# `git archive BASE smalltrain benchmarks ':!smalltrain/datasets/data' | tar -x -C DIR` (the data set is copied from
# the tree); its setting "base" runs there first in each round, so that a change without a knob is timed in the
# same call
stage ab && [ -n "${AB_BASE:-}" ] && [ ! -d "$AB_BASE/smalltrain/datasets/data" ] && \
  cp -r smalltrain/datasets/data "$AB_BASE/smalltrain/datasets/"
# the benchmarks run float32 only (the warm stage, where it ran, compiled the base's beside the tree's)
stage ab && ! stage warm && [ -n "${AB_BASE:-}" ] && warm_kernels "$AB_BASE" 1
stage ab && for round in ${AB_ROUNDS:-1 2}; do for setting in ${AB_BASE:+base} ${AB:-}; do
  echo "$setting (round $round)"
  sets=(); dir=.
  if [ "$setting" = base ]; then dir=$AB_BASE; else knob_args sets "$setting"; fi
  (cd $dir && timeout 120 python3 benchmarks/bench_compile.py --modes smalltrain-compiled --no-torch \
    --config ${AB_CONFIGS:-lenet5:64 lenet5:512 cnn:64} "${sets[@]}" > /tmp/ab_run.txt 2>&1)
  grep -q '^model:batch' /tmp/ab_run.txt && sed -n '/^model:batch/,$p' /tmp/ab_run.txt || tail -5 /tmp/ab_run.txt
done; done | tee "$OUT/ab.txt"
# (an if, not `[ ] &&`: the script's last command sets its exit status, 1 without KCACHE_OUT otherwise)
# (in 15 MB parts, under the device tool's 16 MiB a file; the thirty-fourth session's cache was 17.5 MB)
if [ -n "${KCACHE_OUT:-}" ]; then
  tar -cz -C "$CUPY_CACHE_DIR" . | split -b 15000000 - "$OUT/kcache.tgz.part" && ls -l "$OUT"/kcache.tgz.part*
fi
