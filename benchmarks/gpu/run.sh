#!/usr/bin/env bash
# Builds attnlab on a machine with an NVIDIA GPU and runs everything that needs one: the CUDA
# tests, the CUDA-vs-CPU property run, compute-sanitizer, the GPU benchmarks and the
# experiments. Every log and table goes to OUTDIR (at most two folders deep), and each phase
# appends one line (PASS/FAIL/TIMEOUT/PARTIAL, seconds) to OUTDIR/summary.md. A failing phase
# does not stop the others; each is bounded by `timeout`, so phases can be spread over several
# shorter sessions (--phases). See benchmarks/gpu/README.md.
#
#   benchmarks/gpu/run.sh OUTDIR [--phases LIST] [--quick] [--dry-run] [--background]
#                                [--pack DIR] [--python PYTHON]
set -uo pipefail

usage() {
  cat <<'EOF'
usage: benchmarks/gpu/run.sh OUTDIR [options]

  --phases LIST   comma-separated phases (default: all), run in the order given;
                  "a+b" runs a and b at the same time (not build, not the benchmarks):
                    build        pip-build attnlab with its CUDA kernels for this GPU, install it
                    env          nvidia-smi, versions, torch's default SDPA backend -> env.txt
                    tests        pytest tests/python/test_attention_cuda.py,
                                 test_sparse_attention_cuda.py, test_device.py (+ build info)
                    fuzz         pytest tests/python/test_cuda_vs_cpu_properties.py (2,000 cases)
                    memcheck     tests/cuda_sanitizer.sh with compute-sanitizer memcheck
                    racecheck    tests/cuda_sanitizer.sh with compute-sanitizer racecheck
                    cpu-amx      where the host CPU takes bfloat16 products on AMX tiles (the
                                 GPU machines' CPUs have AMX; few build machines' do):
                                 pytest tests/python/test_reduced_precision_cpu.py
                    bench-speed  benchmarks/attention_cuda.py --tables half float32
                    bench-extra  benchmarks/attention_cuda.py --tables weights memory
                    flash-weights  need_weights on the flash forward (ATTNLAB_CUDA_FLASH_WEIGHTS=1,
                                 off by default until it passes here): the CUDA weights tests,
                                 400 fuzz examples, then the weights table -> bench-flash-weights.md
                    flash-warps  the flash forward in 8-warp blocks (ATTNLAB_CUDA_FLASH_WARPS=8,
                                 off by default): the half-precision and flash CUDA tests
                    ncu          Nsight Compute profiles of the kernels that miss their speed
                                 targets, beside torch's (benchmarks/gpu/ncu_cases.py) -> ncu.md
                    experiments  every experiment's --fast run (and reverse in full) on CUDA
                    anomaly      anomaly, 100 epochs, resumed from its checkpoint
                  groups: all (every phase above, sanitizers side by side),
                          sanitize (memcheck+racecheck), bench (bench-speed,bench-extra)
  --budget S      the whole run's time limit in seconds: each phase gets at most what is left
                  (20 s are kept for --pack); a phase with under 30 s left is SKIPPED
  --quick         smaller runs: 200 fuzz cases, short benchmarks, fast experiments only,
                  anomaly for 2 epochs
  --dry-run       print the commands instead of running them
  --background    anomaly: start it detached (setsid) and return; a later `--phases anomaly`
                  waits for it, or resumes it from its checkpoint
  --pack DIR      afterwards, put at most 8 files in DIR: summary.md, results.tar.gz (all of
                  OUTDIR), the benchmark tables, the built wheel, an unfinished anomaly
                  checkpoint (split into parts below 16 MiB)
  --python PY     interpreter (default: $PYTHON or python3)
  --core FILE     build: no compile; install the wheel in .gpu/wheel (from an earlier build
                  on a machine like this one, whatever sources it came from) and replace its
                  libattnlab.so by FILE, a core compiled elsewhere for this machine's torch
                  by benchmarks/gpu/build_core.sh (the wheel's small Python extension must
                  match the core's build_info interface)

The experiments and anomaly phases call `python3 -m attnlab ... --device cuda`.
Phase time limits (seconds) come from TIMEOUT_<PHASE> (e.g. TIMEOUT_ANOMALY=300,
TIMEOUT_BENCH_SPEED=400); defaults keep each phase under 10 minutes.
State that later runs reuse lives in .gpu/ of the checkout (ignored by git): .gpu/data (the
Fashion-MNIST files, from benchmarks/gpu/pack_data.sh), .gpu/wheel (the wheel and the hash
of the sources it was built from), .gpu/state (feature cache, experiment runs, the anomaly
checkpoint).
EOF
}

REPO=$(cd "$(dirname "$0")/../.." && pwd)

ALL_PHASES=(build env tests fuzz memcheck+racecheck cpu-amx bench-speed bench-extra flash-weights flash-warps ncu experiments anomaly)
OUTDIR="" PHASES="all" QUICK=0 DRY=0 BACKGROUND=0 PACK="" PY=${PYTHON:-python3} BUDGET="" CORE=""
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
    -h|--help) usage; exit 0 ;;
    -*) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) if [[ -n $OUTDIR ]]; then echo "run.sh: one OUTDIR only (got $OUTDIR and $1)" >&2; exit 2; fi
       OUTDIR=$1; shift ;;
  esac
done
if [[ -z $OUTDIR ]]; then usage >&2; exit 2; fi
if [[ -n $BUDGET && ! $BUDGET =~ ^[0-9]+$ ]]; then echo "run.sh: --budget takes whole seconds" >&2; exit 2; fi
STARTED=$(date +%s)

# Expand groups; reject unknown names before anything runs. An entry "a+b" runs a and b at
# the same time (never a benchmark: its timings would suffer).
expand() {
  case $1 in
    all) echo "${ALL_PHASES[@]}" ;;
    sanitize) echo "memcheck+racecheck" ;;
    bench) echo "bench-speed bench-extra" ;;
    build|env|tests|fuzz|memcheck|racecheck|cpu-amx|bench-speed|bench-extra|flash-weights|flash-warps|ncu|experiments|anomaly) echo "$1" ;;
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
      if [[ $list == *bench* || $list == *build* || $list == *ncu* || $list == *flash-weights* ]]; then
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
((DRY)) || mkdir -p "$OUTDIR" || exit 1
GPU_DIR=$REPO/.gpu
STATE=$GPU_DIR/state
WHEEL_DIR=$GPU_DIR/wheel
DATA=$GPU_DIR/data/fashion-mnist
[[ -f $DATA/train-images-idx3-ubyte.gz ]] || DATA=/usr/share/datasets/fashion-mnist
SUMMARY=$OUTDIR/summary.md

# ---- environment shared by every phase -------------------------------------------------------
NPROC=$(env -u OMP_NUM_THREADS nproc 2>/dev/null || echo 4)  # nproc obeys OMP_NUM_THREADS
export CMAKE_BUILD_PARALLEL_LEVEL=$NPROC
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export ATTNLAB_CACHE=$STATE/cache      # the anomaly feature CNN's cache survives between calls
export MPLBACKEND=Agg
export TQDM_MININTERVAL=60             # progress bars in the logs: one update a minute
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
now() { date +%s; }
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

# The last pytest summary line of a log ("12 passed, 1 skipped in 3.4s").
pytest_tally() { grep -aE '^=+ .*(passed|failed|error|skipped|deselected).* in [0-9.]+s' "$1" | tail -n 1 | tr -d '='; }

default_timeout() {
  case $1 in
    build) echo 570 ;; env) echo 120 ;; tests) echo 540 ;; fuzz) echo 540 ;;
    memcheck|racecheck) echo 570 ;; bench-speed|bench-extra) echo 540 ;; ncu) echo 360 ;;
    experiments) echo 570 ;; anomaly) echo 540 ;; cpu-amx) echo 300 ;; *) echo 540 ;;
  esac
}

# ---- phases: each sets NOTE and returns 0 (PASS), 3 (PARTIAL), 124 (TIMEOUT) or other (FAIL)

source_hash() {  # everything that goes into the wheel
  find cpp cmake python CMakeLists.txt pyproject.toml -type f \
       -not -name '*.so' -not -name '*.pyc' -not -path '*/__pycache__/*' -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}

phase_build() {
  local log=$1 hash wheel
  hash="$(source_hash)-sm$CUDA_ARCH-cuda${ATTNLAB_CUDA:-1}-$($PY -c 'import sys, torch; print(f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}")' 2>/dev/null)"
  wheel=$(compgen -G "$WHEEL_DIR/attnlab-*.whl" | head -n 1)
  {
    echo "sources+target: $hash; CUDA architectures: $CUDA_ARCH; $NPROC cores"
    command -v nvcc && nvcc --version | tail -n 2
  } >>"$log" 2>&1
  local pip=("$PY" -m pip --no-input)
  if [[ -n $CORE ]]; then  # no compile: the wheel there is, with this core put in below
    if [[ -z $wheel || ! -f $CORE ]] && ((!DRY)); then
      NOTE="--core needs a wheel in $WHEEL_DIR and the file $CORE"
      echo "$NOTE" >>"$log"; return 1
    fi
    NOTE="installed $(basename "${wheel:-attnlab-VERSION.whl}") with the core $CORE ($(head -n 1 "$(dirname "$CORE")/SOURCE" 2>/dev/null || echo 'no SOURCE file'))"
  elif [[ -n $wheel && -f $WHEEL_DIR/SOURCE_HASH && $(cat "$WHEEL_DIR/SOURCE_HASH") == "$hash" ]]; then
    NOTE="installed the wheel already built from these sources ($(basename "$wheel"))"
  else
    NOTE="built $hash"
    WHEEL_BUILT=1
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
  if [[ -n $CORE ]]; then
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

phase_tests() {
  local log=$1 rc
  # test_device.py: training, evaluation and checkpoints on CUDA; its two tests of the
  # refusal without a GPU skip here by design and are left out.
  step "$log" "$PY" -m pytest tests/python/test_attention_cuda.py \
       tests/python/test_sparse_attention_cuda.py tests/python/test_build_info.py \
       tests/python/test_device.py -k "not without_a_gpu" \
       -v -rs -p no:cacheprovider -o faulthandler_timeout=300 --junitxml="$OUTDIR/tests.junit.xml"
  rc=$?
  NOTE=$(pytest_tally "$log")
  # Every CUDA test must run here: a skip counts against the phase.
  if ((rc == 0 && !DRY)) && grep -aq '^SKIPPED' "$log"; then NOTE="$NOTE (skips: see the log)"; return 1; fi
  return "$rc"
}

phase_fuzz() {
  local log=$1 rc examples=2000
  ((QUICK)) && examples=200
  # The *_checks_run_on_cpu tests are the CPU stand-ins for CI and skip where a GPU is present
  # (by design): left out, so that a skip here still means something went wrong. The case in
  # progress is kept in fuzz-last-case.txt: after a crash, it names the inputs that caused it.
  step "$log" env ATTNLAB_CUDA_FUZZ_EXAMPLES=$examples \
       ATTNLAB_CUDA_FUZZ_TRACE="$OUTDIR/fuzz-last-case.txt" "$PY" -m pytest \
       tests/python/test_cuda_vs_cpu_properties.py -k "not checks_run_on_cpu" \
       -v -rs -p no:cacheprovider -o faulthandler_timeout=300 \
       --hypothesis-show-statistics --junitxml="$OUTDIR/fuzz.junit.xml"
  rc=$?
  NOTE="$examples examples: $(pytest_tally "$log")"
  if ((rc == 0 && !DRY)) && grep -aq '^SKIPPED' "$log"; then NOTE="$NOTE (skipped: no GPU?)"; return 1; fi
  return "$rc"
}

phase_cpu_amx() {  # the CPU's AMX route for bfloat16, which few build or CI machines have had
  local log=$1 route
  if ((DRY)); then
    echo "  (if attnlab.build_info()['cpu_bf16_products'] == 'amx')" \
         "$(quote "$PY" -m pytest tests/python/test_reduced_precision_cpu.py -v -rs)"
    return 0
  fi
  route=$(env -C / "$PY" -c "import attnlab; print(attnlab.build_info()['cpu_bf16_products'])" 2>>"$log")
  if [[ $route != amx ]]; then
    NOTE="this CPU's bfloat16 route is '${route:-unknown}', not amx: nothing to check"
    echo "$NOTE" >>"$log"; return 0
  fi
  step "$log" "$PY" -m pytest tests/python/test_reduced_precision_cpu.py -v -rs -p no:cacheprovider \
       -o faulthandler_timeout=240 --junitxml="$OUTDIR/cpu-amx.junit.xml"
  local rc=$?
  NOTE="bfloat16 on AMX tiles: $(pytest_tally "$log")"
  return "$rc"
}

phase_sanitizer() {  # $2: memcheck or racecheck
  local log=$1 tool=$2 rc
  step "$log" env SANITIZER_TOOLS="$tool" PYTHON="$PY" bash tests/cuda_sanitizer.sh
  rc=$?
  ((DRY)) && return 0
  NOTE="$(grep -ac ' PASSED' "$log") tests passed under $tool; $(grep -aE 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1 | sed 's/^=* *//')"
  # A run in which nothing was watched is no evidence.
  if ((rc == 0)) && ! grep -aq ' PASSED' "$log"; then NOTE="no test ran: $NOTE"; return 1; fi
  return "$rc"
}

phase_bench() {  # $2: speed or extra
  local log=$1 which=$2 budget args
  budget=$((PHASE_DEADLINE - $(now) - 45))
  ((DRY)) && budget=$(($(default_timeout "bench-$which") - 45))
  if [[ $which == speed ]]; then
    args=(--tables half float32)
    ((QUICK)) && args+=(--lengths 2048 4096 --reps 5)
  else
    args=(--tables weights memory)
    ((QUICK)) && args+=(--weights-lengths 4096 --weights-dtypes bfloat16 --memory-lengths 1024 4096 16384 --reps 5)
  fi
  step "$log" env -C "$REPO/benchmarks" "$PY" attention_cuda.py "${args[@]}" \
       --max-seconds "$budget" --out "$OUTDIR/bench-$which.md"
  local rc=$?
  ((DRY)) && return 0
  local missed; missed=$(grep -ac '| MISSED' "$OUTDIR/bench-$which.md" 2>/dev/null)
  NOTE="bench-$which.md: ${missed:-no table,} $(grep -ac '| met' "$OUTDIR/bench-$which.md" 2>/dev/null) rows met a target, ${missed:-?} MISSED"
  grep -aq "time budget" "$OUTDIR/bench-$which.md" 2>/dev/null && NOTE="$NOTE; time budget ran out (skipped cells)"
  return "$rc"
}

phase_flash_weights() {  # the flash forward's weights pass, opt-in until it has passed here
  local log=$1 rc budget
  step "$log" env ATTNLAB_CUDA_FLASH_WEIGHTS=1 "$PY" -m pytest tests/python/test_attention_cuda.py \
       -k "weights" -v -rs -p no:cacheprovider -o faulthandler_timeout=300 \
       --junitxml="$OUTDIR/flash-weights.junit.xml"
  rc=$?
  NOTE="tests with ATTNLAB_CUDA_FLASH_WEIGHTS=1: $(pytest_tally "$log")"
  local examples=400
  ((QUICK)) && examples=100
  step "$log" env ATTNLAB_CUDA_FLASH_WEIGHTS=1 ATTNLAB_CUDA_FUZZ_EXAMPLES=$examples \
       ATTNLAB_CUDA_FUZZ_TRACE="$OUTDIR/flash-weights-fuzz-last-case.txt" "$PY" -m pytest \
       tests/python/test_cuda_vs_cpu_properties.py -k "not checks_run_on_cpu" -rs \
       -p no:cacheprovider -o faulthandler_timeout=300
  local fuzz_rc=$?
  NOTE="$NOTE; fuzz ($examples examples): $(pytest_tally "$log")"
  ((rc == 0)) && rc=$fuzz_rc
  budget=$((PHASE_DEADLINE - $(now) - 45))
  ((DRY)) && budget=$(($(default_timeout flash-weights) - 45))
  local args=(--tables weights)
  ((QUICK)) && args+=(--weights-lengths 4096 --weights-dtypes bfloat16 --reps 5)
  step "$log" env -C "$REPO/benchmarks" ATTNLAB_CUDA_FLASH_WEIGHTS=1 "$PY" attention_cuda.py \
       "${args[@]}" --max-seconds "$budget" --out "$OUTDIR/bench-flash-weights.md"
  local bench_rc=$?
  ((DRY)) && return 0
  NOTE="$NOTE; bench-flash-weights.md: $(grep -ac '| met' "$OUTDIR/bench-flash-weights.md" 2>/dev/null) met, $(grep -ac '| MISSED' "$OUTDIR/bench-flash-weights.md" 2>/dev/null) MISSED"
  ((rc == 0)) && rc=$bench_rc
  return "$rc"
}

phase_flash_warps() {  # the flash forward in 8-warp blocks, opt-in until it has passed here
  local log=$1 rc
  step "$log" env ATTNLAB_CUDA_FLASH_WARPS=8 "$PY" -m pytest tests/python/test_attention_cuda.py \
       -k "half or flash" -v -rs -p no:cacheprovider -o faulthandler_timeout=300 \
       --junitxml="$OUTDIR/flash-warps.junit.xml"
  rc=$?
  NOTE="tests with ATTNLAB_CUDA_FLASH_WARPS=8: $(pytest_tally "$log")"
  if ((rc == 0 && !DRY)) && grep -aq '^SKIPPED' "$log"; then NOTE="$NOTE (skips: see the log)"; return 1; fi
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
  NOTE="${#names[@]} runs, $failed failed: $(printf '%s s, ' "${names[@]}" | sed 's/, $//'); table in experiments.md"
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

pack_results() {
  if ((DRY)); then
    echo "pack into $PACK: summary.md, results.tar.gz, the wheel and SOURCE_HASH (after build)," \
         "an unfinished anomaly checkpoint (after anomaly), bench-*.md while fewer than 8 files"
    return
  fi
  mkdir -p "$PACK" "$GPU_DIR"
  cp "$SUMMARY" "$PACK/summary.md"
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
  # Copies of the tables (they are in results.tar.gz too) while the 8-file limit allows.
  for table in "$OUTDIR"/bench-*.md "$OUTDIR"/ncu.md "$OUTDIR"/experiments.md; do
    [[ -f $table ]] || continue
    (($(find "$PACK" -maxdepth 1 -type f | wc -l) < 8)) && cp "$table" "$PACK/"
  done
  local count; count=$(find "$PACK" -maxdepth 1 -type f | wc -l)
  echo "packed into $PACK ($count files$( ((count > 8)) && echo ': MORE THAN 8, some will not come back')):"
  ls -l "$PACK"
}

# ---- main ----------------------------------------------------------------------------------------

if ((DRY)); then
  echo "dry run: OUTDIR=$OUTDIR, phases: ${SELECTED[*]}, CUDA architecture $CUDA_ARCH, $NPROC cores, python $PY, data $DATA"
else
  { echo; echo "## $(date -u '+%Y-%m-%d %H:%M UTC'): ${SELECTED[*]}$( ((QUICK)) && echo ' (quick)')"; } >>"$SUMMARY"
fi
PACK_RESERVE=20  # seconds kept for --pack at the end of a --budget
WHEEL_BUILT=0

# run_phase NAME: runs one phase within its limit (and what --budget leaves), appends its line
# to summary.md; returns 1 when it failed or timed out.
run_phase() {
  local phase=$1 var limit log started rc seconds result line
  var=TIMEOUT_${phase//-/_}; var=${var^^}
  limit=${!var:-$(default_timeout "$phase")}
  if [[ -n $BUDGET ]]; then
    local left=$((STARTED + BUDGET - PACK_RESERVE - $(now)))
    ((left < limit)) && limit=$left
  fi
  log=$OUTDIR/$phase.log
  ((DRY)) && log=/dev/null
  if [[ -n $BUDGET ]] && ((limit < 30 && !DRY)); then
    line="- $phase: SKIPPED — ${limit}s left of --budget $BUDGET"
    echo "$line"; echo "$line" >>"$SUMMARY"
    return 1
  fi
  PHASE_DEADLINE=$(($(now) + limit))
  NOTE=""
  started=$(now)
  echo "== $phase (at most ${limit}s)"
  ((DRY)) || echo "==== $(date -u '+%H:%M:%S') $phase" >>"$log"
  case $phase in
    build) phase_build "$log" ;;
    env) phase_env "$log" ;;
    tests) phase_tests "$log" ;;
    fuzz) phase_fuzz "$log" ;;
    memcheck|racecheck) phase_sanitizer "$log" "$phase" ;;
    cpu-amx) phase_cpu_amx "$log" ;;
    bench-speed) phase_bench "$log" speed ;;
    bench-extra) phase_bench "$log" extra ;;
    flash-weights) phase_flash_weights "$log" ;;
    flash-warps) phase_flash_warps "$log" ;;
    ncu) phase_ncu "$log" ;;
    experiments) phase_experiments "$log" ;;
    anomaly) phase_anomaly "$log" ;;
  esac
  rc=$?
  seconds=$(($(now) - started))
  case $rc in
    0) result=PASS ;; 3) result=PARTIAL ;; 124|137) result=TIMEOUT ;; *) result=FAIL ;;
  esac
  ((DRY)) && result=DRY
  line="- $phase: $result in ${seconds} s (exit $rc) — ${NOTE:-} [$phase.log]"
  echo "$line"
  ((DRY)) && return 0
  echo "$line" >>"$SUMMARY"
  if [[ $result == FAIL || $result == TIMEOUT ]]; then
    echo "---- last lines of $phase.log"; tail -n 30 "$log"; echo "----"
    return 1
  fi
}

OVERALL=0
for entry in "${SELECTED[@]}"; do
  if [[ $entry != *+* ]]; then
    run_phase "$entry" || OVERALL=1
    continue
  fi
  IFS='+' read -r -a members <<<"$entry"
  echo "== at the same time: ${members[*]}"
  pids=()
  for member in "${members[@]}"; do
    run_phase "$member" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || OVERALL=1; done
done
[[ -n $PACK ]] && pack_results
exit "$OVERALL"
