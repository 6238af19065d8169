#!/usr/bin/env bash
# Builds attnlab on a machine with an NVIDIA GPU and runs what needs one: the CUDA tests, the
# CUDA property run (fuzz), compute-sanitizer with the default and the opt-in kernels, and the
# GPU benchmarks; on request the AMX CPU tests, Nsight Compute profiles, the experiments and the
# 100-epoch anomaly run. The default plan fits one call of 9 minutes (--budget 540) when a wheel
# of these sources comes with the checkout (see README.md beside this). Every log and table goes
# to OUTDIR (at most two folders deep); each phase appends a line (PASS/FAIL/TIMEOUT/PARTIAL/
# SKIPPED, seconds, counts) to OUTDIR/summary.md and OUTDIR/results.tsv; OUTDIR/checks.json
# holds the same with every count, OUTDIR/json/<benchmark>.json the benchmarks' tables.
#
#   benchmarks/gpu/run.sh OUTDIR [--phases LIST] [--budget S] [--fuzz-examples N] [--quick]
#                                [--dry-run] [--background] [--pack DIR] [--python PY] [--core F]
set -uo pipefail

usage() {
  cat <<'EOF'
usage: benchmarks/gpu/run.sh OUTDIR [options]

  --phases LIST   comma-separated phases (default: all), run in the order given;
                  "a+b" runs a and b at the same time (not build, ncu or a benchmark):
                    build          install the wheel of these sources from .gpu/wheel, or
                                   pip-build attnlab with its CUDA kernels for this GPU
                    env            nvidia-smi, versions, torch's default SDPA backend -> env.txt
                    tests          the CUDA tests (test_attention_cuda.py, test_sparse_attention_
                                   cuda.py, test_build_info.py, test_device.py)
                    fuzz           test_cuda_vs_cpu_properties.py (--fuzz-examples, default 2000),
                                   with the shrunk float16 flash case of the last failure
                    memcheck       tests/cuda_sanitizer.sh with compute-sanitizer memcheck
                    racecheck      the same with racecheck
                    memcheck-optin, racecheck-optin
                                   the same with ATTNLAB_CUDA_FLASH_WEIGHTS=1 and
                                   ATTNLAB_CUDA_FLASH_WARPS=8 (the opt-in kernels)
                    flash-weights  ATTNLAB_CUDA_FLASH_WEIGHTS=1: the weights tests and the
                                   half-precision fuzz (N/5 examples)
                    flash-warps    ATTNLAB_CUDA_FLASH_WARPS=8: the half-precision and flash tests
                    bench-attention  benchmarks/attention_cuda.py (speed, weights, memory)
                    bench-sparse   benchmarks/sparse_attention_cuda.py (sparse / softmax)
                    cpu-amx        pytest tests/python/operator/test_reduced_precision_cpu.py where the
                                   host CPU takes bfloat16 products on AMX tiles
                    ncu            Nsight Compute profiles beside torch's kernels -> ncu.md
                    experiments    every experiment's --fast run (and reverse in full) on CUDA
                    anomaly        anomaly, 100 epochs, resumed from its checkpoint
                  groups: all     = build,env,checks,bench (the 9-minute plan)
                          checks  = tests+fuzz+memcheck+racecheck+memcheck-optin+
                                    racecheck-optin+flash-weights+flash-warps
                          sanitize = memcheck+racecheck+memcheck-optin+racecheck-optin
                          bench   = bench-attention,bench-sparse
  --budget S      the whole call's time limit in seconds (default 540; 0: none): each phase
                  gets at most what is left, 20 s are kept for --pack, and a phase with under
                  30 s left is SKIPPED
  --fuzz-examples N   hypothesis examples of the fuzz phase (default 2000: 3/5 float32, 2/5
                  half precision); flash-weights runs N/5 half-precision examples
  --quick         smaller benchmarks (fewer lengths and rounds), fast experiments only, anomaly
                  for 2 epochs; the fuzz size stays --fuzz-examples
  --dry-run       print the plan (each phase's budget) and the commands; run nothing
  --background    anomaly: start it detached (setsid) and return; a later `--phases anomaly`
                  waits for it, or resumes it from its checkpoint
  --pack DIR      afterwards, put at most 8 files in DIR: summary.md, checks.json, the
                  benchmarks' JSON results, results.tar.gz (all of OUTDIR), the wheel built here
                  with its SOURCE_HASH, an unfinished anomaly checkpoint (in parts below
                  16 MiB), then copies of the markdown tables while fewer than 8
  --python PY     interpreter (default: $PYTHON or python3)
  --core FILE     build: no compile; install the wheel in .gpu/wheel and replace its
                  libattnlab.so by FILE, a core compiled elsewhere for this machine's torch by
                  benchmarks/gpu/build_core.sh

Phase time limits (seconds) come from TIMEOUT_<PHASE> (e.g. TIMEOUT_ANOMALY=300,
TIMEOUT_BENCH_ATTENTION=200); --dry-run prints them. BENCH_VARIANTS="8warps flash-weights"
(or "none") picks the opt-in kernels the benchmark times; by default those whose flash-warps or
flash-weights phase passed in OUTDIR. OMP_NUM_THREADS, unless set, is the cores shared out
among phases that run side by side. State that later runs reuse lives in .gpu/ of the checkout
(ignored by git): .gpu/data (Fashion-MNIST, from benchmarks/gpu/pack_data.sh), .gpu/wheel (the
wheel and the hash of the sources it was built from), .gpu/state (caches, runs, the anomaly
checkpoint).
EOF
}

REPO=$(cd "$(dirname "$0")/../.." && pwd)

CHECKS="tests+fuzz+memcheck+racecheck+memcheck-optin+racecheck-optin+flash-weights+flash-warps"
OUTDIR="" PHASES="all" QUICK=0 DRY=0 BACKGROUND=0 PACK="" PY=${PYTHON:-python3} BUDGET=540 CORE=""
FUZZ_EXAMPLES=2000
while (($#)); do
  case $1 in
    --phases) PHASES=${2:?--phases needs a list}; shift 2 ;;
    --phases=*) PHASES=${1#*=}; shift ;;
    --quick) QUICK=1; shift ;;
    --dry-run) DRY=1; shift ;;
    --background) BACKGROUND=1; shift ;;
    --pack) PACK=${2:?--pack needs a folder}; shift 2 ;;
    --pack=*) PACK=${1#*=}; shift ;;
    --python) PY=${2:?--python needs an interpreter}; shift 2 ;;
    --core) CORE=${2:?--core needs a libattnlab.so}; shift 2 ;;
    --core=*) CORE=${1#*=}; shift ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift 2 ;;
    --budget=*) BUDGET=${1#*=}; shift ;;
    --fuzz-examples) FUZZ_EXAMPLES=${2:?--fuzz-examples needs a number}; shift 2 ;;
    --fuzz-examples=*) FUZZ_EXAMPLES=${1#*=}; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) if [[ -n $OUTDIR ]]; then echo "run.sh: one OUTDIR only (got $OUTDIR and $1)" >&2; exit 2; fi
       OUTDIR=$1; shift ;;
  esac
done
if [[ -z $OUTDIR ]]; then usage >&2; exit 2; fi
if [[ ! $BUDGET =~ ^[0-9]+$ ]]; then echo "run.sh: --budget takes whole seconds" >&2; exit 2; fi
if [[ ! $FUZZ_EXAMPLES =~ ^[1-9][0-9]*$ ]]; then
  echo "run.sh: --fuzz-examples takes a positive whole number" >&2; exit 2
fi
STARTED=$(date +%s)
RUN_ID=$(date -u '+%Y-%m-%d %H:%M:%S UTC')

# Expand groups; reject unknown names before anything runs. An entry "a+b" runs a and b at
# the same time (never a benchmark or a profile: their timings would suffer; never build).
expand() {
  case $1 in
    all) echo "build env $CHECKS bench-attention bench-sparse" ;;
    checks) echo "$CHECKS" ;;
    sanitize) echo "memcheck+racecheck+memcheck-optin+racecheck-optin" ;;
    bench) echo "bench-attention bench-sparse" ;;
    build|env|tests|fuzz|memcheck|racecheck|memcheck-optin|racecheck-optin|flash-weights|\
flash-warps|bench-attention|bench-sparse|cpu-amx|ncu|experiments|anomaly) echo "$1" ;;
    *) echo "run.sh: unknown phase '$1' (see --help)" >&2; return 2 ;;
  esac
}
SELECTED=()
IFS=',' read -r -a requested <<<"$PHASES"
for entry in "${requested[@]}"; do
  IFS='+' read -r -a members <<<"$entry"
  if ((${#members[@]} == 1)); then
    list=$(expand "$entry") || exit 2
    read -r -a expanded <<<"$list"
    SELECTED+=("${expanded[@]}")
  else
    group=()
    for member in "${members[@]}"; do
      list=$(expand "$member") || exit 2
      if [[ $list == *bench* || $list == *build* || $list == *ncu* ]]; then
        echo "run.sh: $member cannot run beside other phases ($entry)" >&2; exit 2
      fi
      group+=("${list// /+}")
    done
    SELECTED+=("$(IFS=+; echo "${group[*]}")")
  fi
done
# selected NAME: whether NAME is among the phases of this run.
selected() { [[ " ${SELECTED[*]//+/ } " == *" $1 "* ]]; }

# OUTDIR and --pack are relative to where run.sh is called from; everything else to the checkout.
OUTDIR=$(realpath -m "$OUTDIR")
[[ -n $PACK ]] && PACK=$(realpath -m "$PACK")
[[ -n $CORE ]] && CORE=$(realpath -m "$CORE")
if [[ -n $PACK && $PACK == "$OUTDIR" ]]; then
  echo "run.sh: --pack needs a folder other than OUTDIR (e.g. OUTDIR .gpu/out, --pack \"\$OUT\")" >&2
  exit 2
fi
cd "$REPO" || exit 1
((DRY)) || mkdir -p "$OUTDIR/json" || exit 1
GPU_DIR=$REPO/.gpu
STATE=$GPU_DIR/state
WHEEL_DIR=$GPU_DIR/wheel
DATA=$GPU_DIR/data/fashion-mnist
[[ -f $DATA/train-images-idx3-ubyte.gz ]] || DATA=/usr/share/datasets/fashion-mnist
SUMMARY=$OUTDIR/summary.md
RESULTS=$OUTDIR/results.tsv

# ---- environment shared by every phase -------------------------------------------------------
NPROC=$(env -u OMP_NUM_THREADS nproc 2>/dev/null || echo 4)  # nproc obeys OMP_NUM_THREADS
OMP_FROM_CALLER=${OMP_NUM_THREADS:-}
export CMAKE_BUILD_PARALLEL_LEVEL=$NPROC
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export ATTNLAB_CACHE=$STATE/cache      # the anomaly feature CNN's cache survives between calls
export MPLBACKEND=Agg
export TQDM_MININTERVAL=60             # progress bars in the logs: one update a minute
# The opt-in kernels stay off unless a phase switches them on for itself.
unset ATTNLAB_CUDA_FLASH_WARPS ATTNLAB_CUDA_FLASH_WEIGHTS
for cuda_bin in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
  if [[ -x $cuda_bin/nvcc ]] && ! command -v nvcc >/dev/null 2>&1; then
    export PATH=$cuda_bin:$PATH
  fi
done
if [[ -z ${COMPUTE_SANITIZER:-} ]] && ! command -v compute-sanitizer >/dev/null 2>&1; then
  for candidate in /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer \
                   /opt/nvidia/*/compute-sanitizer /opt/nvidia/*/*/compute-sanitizer; do
    if [[ -x $candidate ]]; then export COMPUTE_SANITIZER=$candidate; break; fi
  done
fi
if [[ -z ${CUDA_ARCH:-} ]]; then
  CUDA_ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
  [[ $CUDA_ARCH =~ ^[0-9]+$ ]] || CUDA_ARCH=90
fi

# ---- helpers -----------------------------------------------------------------------------------
DRY_CLOCK=0  # --dry-run: seconds of the plan so far (each phase taking all of its budget)
now() { if ((DRY)); then echo $((STARTED + DRY_CLOCK)); else date +%s; fi; }
quote() { printf '%q ' "$@"; }

# step LOG CMD...: run CMD within the phase's remaining time, output appended to LOG.
step() {
  local log=$1; shift
  if ((DRY)); then echo "  $(quote "$@")"; return 0; fi
  local left=$((PHASE_DEADLINE - $(now)))
  if ((left <= 0)); then echo "!! no time left for: $(quote "$@")" >>"$log"; return 124; fi
  echo "\$ $(quote "$@")   # at most ${left}s" >>"$log"
  timeout -k 20 "$left" "$@" >>"$log" 2>&1
  local rc=$?
  echo "# exit status $rc" >>"$log"
  return "$rc"
}

# The counts a phase's log shows (pytest, compute-sanitizer, hypothesis), on one line.
counts() { ((DRY)) && return 0; "$PY" "$REPO/benchmarks/gpu/checks_json.py" --note "$1" 2>/dev/null; }

# skipped_tests LOG: whether pytest skipped a test in LOG (every CUDA test must run here).
skipped_tests() { ((!DRY)) && grep -aqE '^SKIPPED|[0-9]+ skipped' "$1"; }

source_hash() {  # everything that goes into the wheel
  find cpp cmake python CMakeLists.txt pyproject.toml -type f \
       -not -name '*.so' -not -name '*.pyc' -not -path '*/__pycache__/*' -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}

build_hash() {  # the sources, the GPU architecture and the Python and torch of this machine
  echo "$(source_hash)-sm$CUDA_ARCH-cuda${ATTNLAB_CUDA:-1}-$("$PY" -c \
    'import sys, torch; print(f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}")' 2>/dev/null)"
}

# How build installs attnlab, found once (the hash imports torch): core (--core), wheel (the
# wheel in .gpu/wheel was built from these sources for this machine) or compile.
BUILD_HASH="" BUILD_ROUTE=compile
if [[ -n $CORE ]]; then
  BUILD_ROUTE=core
elif selected build; then
  BUILD_HASH=$(build_hash)
  if compgen -G "$WHEEL_DIR/attnlab-*.whl" >/dev/null && [[ -f $WHEEL_DIR/SOURCE_HASH &&
       $(cat "$WHEEL_DIR/SOURCE_HASH") == "$BUILD_HASH" ]]; then
    BUILD_ROUTE=wheel
  fi
fi

# Each phase's time limit (seconds): what the default plan gives it, from the times the H200 run
# recorded (README.md, "Phases and their budgets"): the nine-minute call holds build 30 + env 25 + checks 250 (the phases
# side by side) + bench-attention 120 + bench-sparse 75 + 20 for --pack = 520 s. That plan
# assumes the wheel of these sources travels with the checkout (installed in 11-14 s there); a
# compile gets up to 420 s (356 s on the H200's 16 cores) and --budget cuts what follows. The
# dry run plans with the carried wheel: the route here says nothing of the GPU machine's.
default_timeout() {
  case $1 in
    build) if [[ $BUILD_ROUTE == compile ]] && ((!DRY)); then echo 420; else echo 30; fi ;;
    env) echo 25 ;;
    tests|fuzz|memcheck|racecheck|memcheck-optin|racecheck-optin|flash-weights|flash-warps) echo 250 ;;
    bench-attention) echo 120 ;; bench-sparse) echo 75 ;;
    cpu-amx) echo 300 ;; ncu) echo 360 ;; experiments) echo 520 ;; anomaly) echo 520 ;;
    *) echo 250 ;;
  esac
}

phase_limit() {  # TIMEOUT_<PHASE> or the default
  local var=TIMEOUT_${1//-/_}
  var=${var^^}
  echo "${!var:-$(default_timeout "$1")}"
}

# ---- phases: each sets NOTE and returns 0 (PASS), 3 (PARTIAL), 124 (TIMEOUT) or other (FAIL)

phase_build() {
  local log=$1 hash=$BUILD_HASH route=$BUILD_ROUTE wheel
  [[ -n $hash ]] || hash=$(build_hash)
  wheel=$(compgen -G "$WHEEL_DIR/attnlab-*.whl" | head -n 1)
  {
    echo "sources+target: $hash; CUDA architectures: $CUDA_ARCH; $NPROC cores; route: $route"
    command -v nvcc && nvcc --version | tail -n 2
  } >>"$log" 2>&1
  local pip=("$PY" -m pip --no-input)
  if [[ $route == core ]]; then  # no compile: the wheel there is, with this core put in below
    if [[ -z $wheel || ! -f $CORE ]] && ((!DRY)); then
      NOTE="--core needs a wheel in $WHEEL_DIR and the file $CORE"
      echo "$NOTE" >>"$log"; return 1
    fi
    NOTE="installed $(basename "${wheel:-attnlab-VERSION.whl}") with the core $CORE ($(head -n 1 "$(dirname "$CORE")/SOURCE" 2>/dev/null || echo 'no SOURCE file'))"
  elif [[ $route == wheel ]]; then
    NOTE="installed the wheel already built from these sources ($(basename "$wheel"))"
  else
    NOTE="built $hash"
    WHEEL_BUILT=1
    ((DRY)) && echo "  (here no wheel in $WHEEL_DIR matches these sources and this Python and torch: it would compile)"
    ((DRY)) || { rm -f "$WHEEL_DIR"/attnlab-*.whl "$WHEEL_DIR/SOURCE_HASH"; mkdir -p "$WHEEL_DIR"; }
    # pip wheel + install = pip install --no-build-isolation -v . (same build/ folder, so
    # rebuilds on the same machine are incremental), keeping the wheel for later calls.
    # The C++ tests and examples are not built: this is about the Python package's kernels.
    step "$log" env ATTNLAB_CUDA="${ATTNLAB_CUDA:-1}" "${pip[@]}" wheel --no-build-isolation --no-index \
         --no-deps -v --config-settings="cmake.define.CMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH" \
         --config-settings=cmake.define.ATTNLAB_BUILD_TESTS=OFF \
         --config-settings=cmake.define.ATTNLAB_BUILD_EXAMPLES=OFF -w "$WHEEL_DIR" . || return $?
    ((DRY)) || echo "$hash" >"$WHEEL_DIR/SOURCE_HASH"
    wheel=$(compgen -G "$WHEEL_DIR/attnlab-*.whl" | head -n 1)
  fi
  ((DRY)) && wheel=${wheel:-$WHEEL_DIR/attnlab-VERSION.whl}
  step "$log" "${pip[@]}" install --no-index --no-deps --force-reinstall --root-user-action=ignore \
       "$wheel" || return $?
  if [[ $route == core ]]; then
    local target=PACKAGE_FOLDER
    ((DRY)) || target=$(env -C / "$PY" -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('attnlab').origin))") || return 1
    step "$log" cp "$CORE" "$target/libattnlab.so" || return $?
  fi
  # From outside the checkout, so that the installed package is the one imported.
  step "$log" env -C / "$PY" -c "import attnlab; info = attnlab.build_info(); print(info); \
assert info['cuda'], 'attnlab was built without its CUDA kernels'" || return $?
  ((DRY)) || NOTE="$NOTE; wheel $(du -h "$wheel" | cut -f1)"
}

phase_env() {
  local log=$1 out=$OUTDIR/env.txt
  if ((DRY)); then echo "  (nvidia-smi, nvcc, cmake, compute-sanitizer, ncu versions) > $out"
                   echo "  $(quote "$PY" benchmarks/gpu/env_info.py) >> $out"; return 0; fi
  {
    echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -srm), $NPROC cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
    echo "## nvidia-smi"; nvidia-smi 2>&1
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm,power.limit --format=csv 2>&1
    echo "## tools"
    nvcc --version 2>&1 | tail -n 2
    cmake --version 2>&1 | head -n 1; echo "ninja $(ninja --version 2>&1)"
    "${COMPUTE_SANITIZER:-compute-sanitizer}" --version 2>&1 | tail -n 1; ncu --version 2>&1 | tail -n 1
    echo "## python"
    timeout 100 env -C / "$PY" "$REPO/benchmarks/gpu/env_info.py" 2>&1
  } >"$out"
  cat "$out" >>"$log"
  NOTE="$(grep -m1 '^GPU 0' "$out"); $(grep -m1 '^torch ' "$out")"
  grep -q '^GPU 0' "$out"
}

PYTEST_FLAGS=(-v -rfEs -p no:cacheprovider -o faulthandler_timeout=200)

phase_tests() {
  local log=$1 rc
  # test_device.py: training, evaluation and checkpoints on CUDA; its two tests of the
  # refusal without a GPU skip here by design and are left out.
  step "$log" "$PY" -m pytest tests/python/operator/test_attention_cuda.py \
       tests/python/operator/test_sparse_attention_cuda.py tests/python/operator/test_build_info.py \
       tests/python/experiments/test_device.py -k "not without_a_gpu" "${PYTEST_FLAGS[@]}" \
       --junitxml="$OUTDIR/tests.junit.xml"
  rc=$?
  NOTE=$(counts "$log")
  # Every CUDA test must run here: a skip counts against the phase.
  if ((rc == 0)) && skipped_tests "$log"; then NOTE="$NOTE (skips: see the log)"; return 1; fi
  return "$rc"
}

phase_fuzz() {
  local log=$1 rc
  # The *_checks_run_on_cpu tests are the CPU stand-ins for CI and skip where a GPU is present
  # (by design): left out, so that a skip here still means something went wrong. The case in
  # progress is kept in fuzz-last-case.txt: after a crash, it names the inputs that caused it.
  step "$log" env ATTNLAB_CUDA_FUZZ_EXAMPLES="$FUZZ_EXAMPLES" \
       ATTNLAB_CUDA_FUZZ_TRACE="$OUTDIR/fuzz-last-case.txt" "$PY" -m pytest \
       tests/python/operator/test_cuda_vs_cpu_properties.py -k "not checks_run_on_cpu" \
       "${PYTEST_FLAGS[@]}" --hypothesis-show-statistics --junitxml="$OUTDIR/fuzz.junit.xml"
  rc=$?
  NOTE="$FUZZ_EXAMPLES examples: $(counts "$log")"
  if ((rc == 0)) && skipped_tests "$log"; then NOTE="$NOTE (skipped: no GPU?)"; return 1; fi
  return "$rc"
}

phase_cpu_amx() {  # the CPU's AMX route for bfloat16, which few build or CI machines have had
  local log=$1 route
  if ((DRY)); then
    echo "  (if attnlab.build_info()['cpu_bf16_products'] == 'amx')" \
         "$(quote "$PY" -m pytest tests/python/operator/test_reduced_precision_cpu.py "${PYTEST_FLAGS[@]}")"
    return 0
  fi
  route=$(env -C / "$PY" -c "import attnlab; print(attnlab.build_info()['cpu_bf16_products'])" 2>>"$log")
  if [[ $route != amx ]]; then
    NOTE="this CPU's bfloat16 route is '${route:-unknown}', not amx: nothing to check"
    echo "$NOTE" >>"$log"; return 0
  fi
  step "$log" "$PY" -m pytest tests/python/operator/test_reduced_precision_cpu.py "${PYTEST_FLAGS[@]}" \
       --junitxml="$OUTDIR/cpu-amx.junit.xml"
  local rc=$?
  NOTE="bfloat16 on AMX tiles: $(counts "$log")"
  return "$rc"
}

phase_sanitizer() {  # $2: memcheck or racecheck; $3: 1 with the opt-in kernels switched on
  local log=$1 tool=$2 opt_in=$3 rc
  step "$log" env SANITIZER_TOOLS="$tool" SANITIZER_OPT_IN="$opt_in" PYTHON="$PY" \
       bash tests/cuda_sanitizer.sh
  rc=$?
  ((DRY)) && return 0
  NOTE="$( ((opt_in)) && echo 'ATTNLAB_CUDA_FLASH_WEIGHTS=1 ATTNLAB_CUDA_FLASH_WARPS=8: ')$(counts "$log"); $(grep -aE 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1 | sed 's/^=* *//')"
  # A run in which nothing was watched is no evidence.
  if ((rc == 0)) && ! grep -aq ' PASSED' "$log"; then NOTE="no test ran: $NOTE"; return 1; fi
  return "$rc"
}

phase_flash_weights() {  # the flash forward's weights pass, opt-in until it has passed here
  local log=$1 rc
  step "$log" env ATTNLAB_CUDA_FLASH_WEIGHTS=1 "$PY" -m pytest tests/python/operator/test_attention_cuda.py \
       -k "weights" "${PYTEST_FLAGS[@]}" --junitxml="$OUTDIR/flash-weights.junit.xml"
  rc=$?
  # The half-precision property (2/5 of N/2: N/5 examples) and the check that the cases meant
  # for the flash kernels run them, with weights on the flash forward.
  step "$log" env ATTNLAB_CUDA_FLASH_WEIGHTS=1 ATTNLAB_CUDA_FUZZ_EXAMPLES=$((FUZZ_EXAMPLES / 2)) \
       ATTNLAB_CUDA_FUZZ_TRACE="$OUTDIR/flash-weights-fuzz-last-case.txt" "$PY" -m pytest \
       tests/python/operator/test_cuda_vs_cpu_properties.py \
       -k "half_precision_cuda_within or flash_eligible_cases" "${PYTEST_FLAGS[@]}" \
       --hypothesis-show-statistics
  local fuzz_rc=$?
  ((rc == 0)) && rc=$fuzz_rc
  NOTE="with ATTNLAB_CUDA_FLASH_WEIGHTS=1: $(counts "$log")"
  if ((rc == 0)) && skipped_tests "$log"; then NOTE="$NOTE (skips: see the log)"; return 1; fi
  return "$rc"
}

phase_flash_warps() {  # the flash forward in 8-warp blocks, opt-in until it has passed here
  local log=$1 rc
  step "$log" env ATTNLAB_CUDA_FLASH_WARPS=8 "$PY" -m pytest tests/python/operator/test_attention_cuda.py \
       -k "half or flash" "${PYTEST_FLAGS[@]}" --junitxml="$OUTDIR/flash-warps.junit.xml"
  rc=$?
  NOTE="with ATTNLAB_CUDA_FLASH_WARPS=8: $(counts "$log")"
  if ((rc == 0)) && skipped_tests "$log"; then NOTE="$NOTE (skips: see the log)"; return 1; fi
  return "$rc"
}

# latest_result PHASE: the last result results.tsv holds for PHASE in OUTDIR (empty if none).
latest_result() {
  [[ -f $RESULTS ]] || return 0
  awk -F'\t' -v phase="$1" '$2 == phase { result = $3 } END { print result }' "$RESULTS"
}

bench_variants() {  # the opt-in kernels the benchmark times: those whose tests passed here
  if [[ -n ${BENCH_VARIANTS:-} ]]; then
    [[ $BENCH_VARIANTS == none ]] || echo "$BENCH_VARIANTS"
    return
  fi
  local variants=()
  [[ $(latest_result flash-warps) == PASS ]] && variants+=(8warps)
  [[ $(latest_result flash-weights) == PASS ]] && variants+=(flash-weights)
  echo "${variants[*]}"
}

# verdicts FILE: "m met, n MISSED" from a markdown table's verdict cells.
verdicts() { echo "$(grep -ao '| met (' "$1" 2>/dev/null | wc -l) met, $(grep -ao '| MISSED (' "$1" 2>/dev/null | wc -l) MISSED"; }

phase_bench_attention() {
  local log=$1 budget args variants tables rc
  budget=$((PHASE_DEADLINE - $(now) - 20))  # startup and the case in flight when it runs out
  read -r -a variants <<<"$(bench_variants)"
  read -r -a tables <<<"${BENCH_TABLES:-half float32 weights memory}"
  if ((QUICK)); then
    args=(--lengths 1024 4096 --float32-lengths 1024 4096 --weights-lengths 4096
          --memory-lengths 1024 4096 16384 --reps 3)
  else
    # Every target's lengths: half precision from 1024 to 8192, float32 to 4096 (8192 alone
    # would take as long as the three shorter ones), the weights at 2048-8192 in bfloat16.
    args=(--lengths 1024 2048 4096 8192 --float32-lengths 1024 2048 4096
          --weights-lengths 2048 4096 8192 --memory-lengths 1024 4096 16384 --reps 5)
  fi
  ((DRY)) && echo "  (opt-in columns: those of flash-warps and flash-weights if they passed" \
                  "earlier in OUTDIR, or BENCH_VARIANTS)"
  step "$log" env -C "$REPO/benchmarks" "$PY" attention_cuda.py \
       --tables "${tables[@]}" --weights-dtypes bfloat16 \
       --variants "${variants[@]}" "${args[@]}" --max-seconds "$budget" \
       --out "$OUTDIR/bench-attention.md" --json "$OUTDIR/json/attention_cuda.json"
  rc=$?
  ((DRY)) && return 0
  NOTE="bench-attention.md: $(verdicts "$OUTDIR/bench-attention.md"); opt-in columns: ${variants[*]:-none}"
  grep -aq "time budget" "$OUTDIR/bench-attention.md" 2>/dev/null && NOTE="$NOTE; time budget ran out (skipped cells)"
  return "$rc"
}

phase_bench_sparse() {
  local log=$1 budget args rc
  budget=$((PHASE_DEADLINE - $(now) - 15))
  if ((QUICK)); then args=(--lengths 1024 4096 --alphas 2 1.5 --reps 3)
  else args=(--lengths 1024 2048 4096 --reps 5); fi
  # bfloat16 first: the normalizers against softmax's flash kernels, the target's case.
  step "$log" env -C "$REPO/benchmarks" "$PY" sparse_attention_cuda.py --dtypes bfloat16 float32 \
       "${args[@]}" --max-seconds "$budget" --out "$OUTDIR/bench-sparse.md" \
       --json "$OUTDIR/json/sparse_attention_cuda.json"
  rc=$?
  ((DRY)) && return 0
  NOTE="bench-sparse.md: $(verdicts "$OUTDIR/bench-sparse.md")"
  grep -aq "time budget" "$OUTDIR/bench-sparse.md" 2>/dev/null && NOTE="$NOTE; time budget ran out (skipped cells)"
  return "$rc"
}

phase_ncu() {
  local log=$1 rc
  local cases=()
  [[ -n ${NCU_CASES:-} ]] && read -r -a cases <<<"--cases $NCU_CASES"  # e.g. NCU_CASES="flash-bwd-d128 f32-fwd-d64"
  step "$log" "$PY" benchmarks/gpu/ncu_cases.py --profile "$OUTDIR/ncu" "${cases[@]}"
  rc=$?
  ((DRY)) && return 0
  [[ -f $OUTDIR/ncu/ncu.md ]] && cp "$OUTDIR/ncu/ncu.md" "$OUTDIR/ncu.md"
  NOTE="ncu.md: $(grep -cE '^\| (attnlab|torch) ' "$OUTDIR/ncu.md" 2>/dev/null) kernels profiled"
  return "$rc"
}

# copy_run NAME FOLDER: results.json and plots of a run into OUTDIR/runs/NAME (no checkpoint).
copy_run() {
  ((DRY)) && return 0
  [[ -d $2 ]] || return 0
  mkdir -p "$OUTDIR/runs/$1"
  find "$2" -maxdepth 1 -type f \( -name '*.json' -o -name '*.png' \) -exec cp {} "$OUTDIR/runs/$1/" \;
}

experiment_table() {  # experiments.md from the copied results.json files
  "$PY" - "$OUTDIR/runs" "$@" >"$OUTDIR/experiments.md" <<'PYEOF'
import json, sys
from pathlib import Path
runs, names = Path(sys.argv[1]), sys.argv[2:]
print("| run | device | metrics | training seconds | wall seconds |\n|---|---|---|---|---|")
for entry in names:
    name, wall = entry.rsplit("=", 1)
    path = runs / name / "results.json"
    if not path.exists():
        print(f"| {name} | | no results.json (failed or cut off: see experiments.log) | | {wall} |")
        continue
    result = json.loads(path.read_text())
    metrics = "; ".join(
        f"{split} " + ", ".join(f"{k} {100 * v:.2f} %" if k == "accuracy" else f"{k} {v:.4g}"
                                for k, v in result[split].items() if isinstance(v, (int, float)))
        for split in ("test", "val", "train") if isinstance(result.get(split), dict))
    if not metrics:  # sparse-and / rule-and: their own summaries
        metrics = ", ".join(f"{k}: {json.dumps(v)[:80]}" for k, v in result.items()
                            if k not in ("experiment", "fast", "build", "config", "history"))[:400]
    device = result.get("device") or result.get("config", {}).get("device", "")
    seconds = result.get("seconds", "")
    print(f"| {name} | {device} | {metrics} | {seconds if seconds == '' else f'{seconds:.1f}'} | {wall} |")
PYEOF
}

# Fails at once when the command line has no --device (added by a change being merged).
check_device_option() {
  ((DRY)) && return 0
  if ! env -C / "$PY" -m attnlab reverse --help 2>/dev/null | grep -q -- '--device'; then
    echo "this attnlab's experiments have no --device option yet" >>"$1"
    NOTE="python -m attnlab has no --device option: merge the change that adds it"
    return 1
  fi
}

phase_experiments() {
  local log=$1 failed=0 names=() name
  check_device_option "$log" || return 1
  local corpus=$STATE/demo-aclImdb
  step "$log" "$PY" -c "import sys; from attnlab.tasks.text import write_demo_corpus; write_demo_corpus(sys.argv[1])" "$corpus"
  # name | arguments (--device cuda --quiet --out are added)
  # anomaly-fast last: it trains the feature CNN whose cache the anomaly phase reuses.
  local runs=(
    "reverse|reverse"
    "reverse-fast|reverse --fast"
    "permutation-fast|permutation --fast --autoregressive"
    "permutation-additive-fast|permutation --fast --autoregressive --attention additive"
    "text-fast|text --fast --data $corpus"
    "sparse-and-fast|sparse-and --fast"
    "rule-and-fast|rule-and --fast"
    "anomaly-fast|anomaly --fast --data $DATA"
  )
  for run in "${runs[@]}"; do
    name=${run%%|*}
    [[ $name == reverse ]] && ((QUICK)) && continue
    read -r -a run_args <<<"${run#*|}"
    ((DRY)) || rm -rf "$STATE/runs/$name"
    echo "== $name" >>"$log"
    local started; started=$(now)
    if step "$log" "$PY" -m attnlab "${run_args[@]}" --device cuda --quiet --out "$STATE/runs/$name"; then
      echo "== $name: $(($(now) - started)) s wall" >>"$log"
    else
      failed=$((failed + 1)); echo "== $name FAILED" >>"$log"
    fi
    copy_run "$name" "$STATE/runs/$name"
    names+=("$name=$(($(now) - started))")
  done
  ((DRY)) || experiment_table "${names[@]}"
  # An exit status of 0 says the run finished, not that it learned: the accuracies are in
  # experiments.md (text --fast on the small demo corpus can sit at chance).
  NOTE="${#names[@]} runs, $failed exited non-zero: $(printf '%s s, ' "${names[@]}" | sed 's/, $//'); accuracies in experiments.md"
  ((failed == 0))
}

accuracies() {  # "train 97.45 %, val ..., test ... (1234 s of training)" from a results.json
  "$PY" - "$1" <<'PYEOF' 2>&1
import json, sys
result = json.load(open(sys.argv[1]))
splits = [f"{split} {100 * result[split]['accuracy']:.2f} %" for split in ("train", "val", "test")
          if "accuracy" in result.get(split, {})]
print(", ".join(splits), f"({result.get('seconds', 0):.0f} s of training)")
PYEOF
}

phase_anomaly() {
  local log=$1 out=$STATE/anomaly-100 epochs=100 pidfile=$STATE/anomaly-100.pid
  ((QUICK)) && { epochs=2; out=$STATE/anomaly-quick; pidfile=$STATE/anomaly-quick.pid; }
  check_device_option "$log" || return 1
  local cmd=("$PY" -m attnlab anomaly --epochs "$epochs" --device cuda --data "$DATA" --out "$out")
  # Without --quiet the log gets one line per epoch (progress bars only every minute).
  if ((DRY)); then
    echo "  $(quote "${cmd[@]}")   # resumes from $out/checkpoint.pt$( ((BACKGROUND)) && echo ', detached')"
    return 0
  fi
  mkdir -p "$STATE"
  local pid="" rc=0
  [[ -f $pidfile ]] && pid=$(cat "$pidfile")
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    echo "waiting for the detached run (pid $pid)" >>"$log"
    while kill -0 "$pid" 2>/dev/null && (($(now) < PHASE_DEADLINE)); do sleep 10; done
    kill -0 "$pid" 2>/dev/null && rc=124
  elif [[ -f $out/results.json ]]; then
    echo "already finished: $out/results.json" >>"$log"
  elif ((BACKGROUND)); then
    echo "\$ $(quote "${cmd[@]}")   # detached" >>"$log"
    setsid nohup "${cmd[@]}" >>"$OUTDIR/anomaly-background.log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    NOTE="started detached (pid $!), log anomaly-background.log; run --phases anomaly again to wait or resume"
    return 3
  else
    step "$log" "${cmd[@]}"; rc=$?
  fi
  local epoch
  epoch=$("$PY" -c "import sys, torch; print(torch.load(sys.argv[1], map_location='cpu', weights_only=False)['epoch'])" \
          "$out/checkpoint.pt" 2>/dev/null || echo 0)
  copy_run "anomaly-$epochs" "$out"
  if [[ -f $out/results.json ]] && ((rc == 0)); then
    NOTE="finished $epoch/$epochs epochs: $(accuracies "$out/results.json")"
    return 0
  fi
  if ((rc == 124)); then
    NOTE="epoch $epoch/$epochs when the time ran out; the same phase again resumes from $out/checkpoint.pt"
    return 3
  fi
  NOTE="failed at epoch $epoch/$epochs (exit status $rc; see anomaly.log and anomaly-background.log)"
  ((rc == 0)) && return 1  # a detached run that ended without its results
  return "$rc"
}

# ---- pack: at most 8 files, each below 16 MiB --------------------------------------------------

# pack_file SRC NAME: copy SRC to PACK/NAME, or split it into NAME.part-aa, -ab, ... of 15 MiB.
pack_file() {
  local src=$1 name=$2
  [[ -f $src ]] || return 0
  if (($(stat -c %s "$src") <= 15 * 1024 * 1024)); then cp "$src" "$PACK/$name"
  else split -b 15M -a 2 "$src" "$PACK/$name.part-"; fi
}

pack_count() { find "$PACK" -maxdepth 1 -type f | wc -l; }

pack_results() {
  if ((DRY)); then
    echo "pack into $PACK (at most 8 files): summary.md, checks.json, json/*.json" \
         "(attention_cuda.json, sparse_attention_cuda.json), results.tar.gz, the wheel and" \
         "SOURCE_HASH (when build compiled), an unfinished anomaly checkpoint (after anomaly)," \
         "then bench-*.md while fewer than 8 files"
    return
  fi
  mkdir -p "$PACK" "$GPU_DIR"
  cp "$SUMMARY" "$PACK/summary.md"
  [[ -f $OUTDIR/checks.json ]] && cp "$OUTDIR/checks.json" "$PACK/checks.json"
  local result
  for result in "$OUTDIR"/json/*.json; do
    [[ -f $result ]] && cp "$result" "$PACK/"
  done
  tar -czf "$GPU_DIR/results.tar.gz" -C "$(dirname "$OUTDIR")" "$(basename "$OUTDIR")"
  pack_file "$GPU_DIR/results.tar.gz" results.tar.gz
  local wheel; wheel=$(compgen -G "$WHEEL_DIR/attnlab-*.whl" | head -n 1)
  if [[ -n $wheel ]] && ((WHEEL_BUILT)); then  # a wheel that came with the checkout stays out
    pack_file "$wheel" "$(basename "$wheel")"
    cp "$WHEEL_DIR/SOURCE_HASH" "$PACK/SOURCE_HASH"
  fi
  if selected anomaly && [[ -f $STATE/anomaly-100/checkpoint.pt && ! -f $STATE/anomaly-100/results.json ]]; then
    pack_file "$STATE/anomaly-100/checkpoint.pt" anomaly-100-checkpoint.pt
  fi
  # Copies of the markdown tables (they are in results.tar.gz too) while the limit allows.
  local table
  for table in "$OUTDIR"/bench-*.md "$OUTDIR"/ncu.md "$OUTDIR"/experiments.md; do
    [[ -f $table ]] || continue
    (($(pack_count) < 8)) && cp "$table" "$PACK/"
  done
  local count; count=$(pack_count)
  echo "packed into $PACK ($count files$( ((count > 8)) && echo ': MORE THAN 8, some will not come back')):"
  ls -l "$PACK"
}

# ---- the plan ------------------------------------------------------------------------------------

# entry_budget ENTRY: the seconds an entry of SELECTED may take (the longest of "a+b").
entry_budget() {
  local longest=0 member limit
  IFS='+' read -r -a members <<<"$1"
  for member in "${members[@]}"; do
    limit=$(phase_limit "$member")
    ((limit > longest)) && longest=$limit
  done
  echo "$longest"
}

print_plan() {
  local total=0 entry budget
  echo "plan: $( ((BUDGET)) && echo "--budget $BUDGET s, $PACK_RESERVE s of it kept for --pack" || echo 'no --budget')" \
       "(limits: TIMEOUT_<PHASE>)"
  printf '  %-34s %7s %8s\n' "phase (a+b: side by side)" "budget" "ends by"
  for entry in "${SELECTED[@]}"; do
    budget=$(entry_budget "$entry")
    if ((BUDGET)); then
      local left=$((BUDGET - PACK_RESERVE - total))
      ((left < 0)) && left=0
      ((budget > left)) && budget=$left
    fi
    total=$((total + budget))
    if [[ $entry == *+* ]]; then
      printf '  %-34s %6ss %7ss\n' "side by side:" "$budget" "$total"
      local member
      IFS='+' read -r -a members <<<"$entry"
      for member in "${members[@]}"; do printf '    %-32s %6ss\n' "$member" "$(phase_limit "$member")"; done
    else
      printf '  %-34s %6ss %7ss\n' "$entry" "$budget" "$total"
    fi
  done
  if ((BUDGET)); then
    echo "  total $((total + PACK_RESERVE)) s of $BUDGET s with --pack's $PACK_RESERVE s"
  else
    echo "  total $total s"
  fi
  if selected build && [[ -z $CORE ]]; then
    echo "  build: planned as installing the wheel of these sources carried in .gpu/wheel (11-14 s" \
         "on the H200); where none matches ($BUILD_ROUTE here), it compiles for up to 420 s and" \
         "--budget cuts the phases after it (README.md: building the wheel beforehand)"
  fi
}

# ---- main ----------------------------------------------------------------------------------------

PACK_RESERVE=20  # seconds kept for --pack at the end of a --budget
((PACK_RESERVE = BUDGET ? PACK_RESERVE : 0))
WHEEL_BUILT=0
if ((DRY)); then
  echo "dry run: OUTDIR=$OUTDIR, CUDA architecture $CUDA_ARCH, $NPROC cores, python $PY," \
       "fuzz $FUZZ_EXAMPLES examples$( ((QUICK)) && echo ', quick'), data $DATA"
  print_plan
else
  { echo; echo "## $RUN_ID: ${SELECTED[*]}$( ((QUICK)) && echo ' (quick)'), fuzz $FUZZ_EXAMPLES examples"; } >>"$SUMMARY"
fi

# run_phase NAME [SIDE_BY_SIDE]: runs one phase within its limit (and what --budget leaves),
# appends its line to summary.md and results.tsv; returns 1 when it failed or timed out.
run_phase() {
  local phase=$1 beside=${2:-1} own limit log started rc seconds result line
  own=$(phase_limit "$phase")
  limit=$own
  if ((BUDGET)); then
    local left=$((STARTED + BUDGET - PACK_RESERVE - $(now)))
    ((left < limit)) && limit=$left
  fi
  log=$OUTDIR/$phase.log
  ((DRY)) && log=/dev/null
  ((limit < 0)) && limit=0
  LAST_LIMIT=$limit
  if ((limit < own && limit < 30)); then  # what --budget leaves is too short to start
    line="- $phase: SKIPPED — ${limit}s left of --budget $BUDGET"
    echo "$line"
    ((DRY)) && return 0
    echo "$line" >>"$SUMMARY"
    printf '%s\t%s\tSKIPPED\t0\t0\t%s\n' "$RUN_ID" "$phase" "${limit}s left of --budget $BUDGET" >>"$RESULTS"
    return 1
  fi
  # Phases side by side share the cores (torch would start one thread per core in each).
  if [[ -z $OMP_FROM_CALLER ]]; then
    local threads=$((NPROC / beside))
    ((threads < 2)) && threads=2
    export OMP_NUM_THREADS=$threads
  fi
  PHASE_DEADLINE=$(($(now) + limit))
  NOTE=""
  started=$(now)
  echo "== $phase (at most ${limit}s$( [[ -z $OMP_FROM_CALLER ]] && ((beside > 1)) && echo ", $OMP_NUM_THREADS threads"))"
  ((DRY)) || echo "==== $(date -u '+%H:%M:%S') $phase" >>"$log"
  case $phase in
    build) phase_build "$log" ;;
    env) phase_env "$log" ;;
    tests) phase_tests "$log" ;;
    fuzz) phase_fuzz "$log" ;;
    memcheck|racecheck) phase_sanitizer "$log" "$phase" 0 ;;
    memcheck-optin|racecheck-optin) phase_sanitizer "$log" "${phase%-optin}" 1 ;;
    flash-weights) phase_flash_weights "$log" ;;
    flash-warps) phase_flash_warps "$log" ;;
    bench-attention) phase_bench_attention "$log" ;;
    bench-sparse) phase_bench_sparse "$log" ;;
    cpu-amx) phase_cpu_amx "$log" ;;
    ncu) phase_ncu "$log" ;;
    experiments) phase_experiments "$log" ;;
    anomaly) phase_anomaly "$log" ;;
  esac
  rc=$?
  seconds=$(($(now) - started))
  case $rc in
    0) result=PASS ;; 3) result=PARTIAL ;; 124|137) result=TIMEOUT ;; *) result=FAIL ;;
  esac
  ((DRY)) && return 0
  line="- $phase: $result in ${seconds} s (exit $rc) — ${NOTE:-} [$phase.log]"
  echo "$line"
  echo "$line" >>"$SUMMARY"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$RUN_ID" "$phase" "$result" "$seconds" "$rc" "${NOTE//$'\t'/ }" >>"$RESULTS"
  if [[ $result == FAIL || $result == TIMEOUT ]]; then
    echo "---- last lines of $phase.log"; tail -n 30 "$log"; echo "----"
    return 1
  fi
}

OVERALL=0
for entry in "${SELECTED[@]}"; do
  if [[ $entry != *+* ]]; then
    run_phase "$entry" || OVERALL=1
    ((DRY)) && DRY_CLOCK=$((DRY_CLOCK + LAST_LIMIT))
    continue
  fi
  IFS='+' read -r -a members <<<"$entry"
  echo "== at the same time: ${members[*]}"
  if ((DRY)); then  # one after the other on the plan's clock, all starting at the same time
    longest=0
    for member in "${members[@]}"; do
      run_phase "$member" "${#members[@]}"
      ((LAST_LIMIT > longest)) && longest=$LAST_LIMIT
    done
    DRY_CLOCK=$((DRY_CLOCK + longest))
    continue
  fi
  pids=()
  for member in "${members[@]}"; do
    run_phase "$member" "${#members[@]}" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || OVERALL=1; done
done
if ((!DRY)); then
  "$PY" "$REPO/benchmarks/gpu/checks_json.py" "$OUTDIR" || OVERALL=1
fi
[[ -n $PACK ]] && pack_results
exit "$OVERALL"
