#!/usr/bin/env bash
# One call on the GPU runner does everything (device time is scarce): environment, the test suite on CUDA,
# the case corpus, the bench. Usage: scripts/gpu_run.sh [STEP...] (default: env tests cases bench); each step is an
# arm of the case statement below, its comment says what it runs, and an unknown step name prints them all. Full
# logs go under $OUT (the device tool brings them back); a short table is printed last.
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"  # a given OUT may not exist yet: every step tees its log there
# What OUT holds before the first step (a caller's log redirected into it, an earlier call's archive) is the
# caller's: the packing at the end leaves it in place and archives only what this script wrote.
mapfile -t callers < <(cd "$OUT" && ls -A)
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
WORKERS=${WORKERS:-8}
steps=${*:-env tests cases bench}
# Every step name is checked before the first runs: a misspelt one found halfway loses the rest of a scarce call.
known=" $(sed -n 's/^    \([a-z0-9|-]*\))\( .*\)\{0,1\}$/\1/p' "$0" | tr '|\n' '  ') "
for step in $steps; do
  case "$known" in *" $step "*) ;; *) echo "unknown step $step; the steps are:$known" >&2; exit 2 ;; esac
done
summary=()

STEP_TIMEOUT=${STEP_TIMEOUT:-240}  # seconds per step, so one slow step cannot eat the whole call

run_step() {  # name, command...: run under a time limit, tee the log, record wall time and exit status
  local name=$1; shift
  local t0=$(date +%s%N)
  timeout "$STEP_TIMEOUT" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  summary+=("$(printf '%-12s rc=%-3s %6d.%01ds  %s' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-110)")")
}

start_samplers() {  # name: the GPU's use every second and the host's CPU every half second (/proc/stat's first
  # line: whether the cores are busy through the items) into $OUT/<name>-smi.csv and -cpu.log, until stop_samplers
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader -l 1 > "$OUT/$1-smi.csv" 2>&1 &
  smi=$!
  (while :; do echo "$(date +%s.%N) $(head -n 1 /proc/stat)"; sleep 0.5; done) > "$OUT/$1-cpu.log" 2>&1 &
  cpu=$!
}

stop_samplers() {
  kill $smi $cpu 2>/dev/null
}

torch_bytecode() {  # whether $PY imports torch from byte-code. The pyc step's prefix lives in its invocation's
  # environment only: a readme-warm in a later invocation without the same PYTHONPYCACHEPREFIX compiles torch from
  # source in every process, so its time is not comparable with readme's (the env step and each readme summary say)
  $PY -c "import importlib.util as u, os; spec = u.find_spec('torch'); \
print('no torch to import' if spec is None else 'yes' if os.path.exists(u.cache_from_source(spec.origin)) else \
'no (every process compiles torch from source: run pyc in this invocation or pass its PYTHONPYCACHEPREFIX)')" \
    2>&1 | tail -n 1
}

unique_name() {  # a step's log name, numbered when the step already ran in this call (e.g. baseline, baseline-2)
  local name=$1 n=2
  while [ -e "$OUT/$name.log" ]; do name="$1-$n"; n=$((n + 1)); done
  echo "$name"
}

findings() {  # report, file[, reasons]: first line (a step's summary) the items' counts, the case items run and
  # whether the run finished; then each failure and, with "reasons", each item's skip or xfail reason. A run stopped
  # before pytest wrote its report is read from its workers' live parts (harness.report.load_report); the exit
  # status is 0 only where the report itself was read, so that a caller removes the parts only then.
  REASONS=${3:-} $PY - "$1" > "$2" 2>&1 <<'EOF'
import os, sys
from harness.report import load_report
try:
    report, note = load_report(sys.argv[1])
except FileNotFoundError:
    sys.exit(f"no report and no live parts at {sys.argv[1]}: the step's log says why")
run = sum(i.nodeid.startswith("cases/") and i.outcome != "skipped" for i in report.items)
print(f"items {report.counts()} case items run {run}",
      f"- NOT FINISHED: {report.unfinished}" if report.unfinished else "- finished", *([f"({note})"] if note else []))
for item in report.failures:
    print(f"=== {item.nodeid}\n{item.message}")
for item in report.items if os.environ["REASONS"] else ():
    if item.reason:
        print(f"--- {item.nodeid}: {item.reason}")
sys.exit(3 if note else 0)
EOF
}

for step in $steps; do
  case $step in
    env)
      run_step env bash -c "nvidia-smi -L; $PY -c 'import torch, triton, numpy, hypothesis, sys; print(sys.version.split()[0], torch.__version__, triton.__version__, numpy.__version__, \"hypothesis\", hypothesis.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())'; echo commit \${COMMIT:-unknown}; echo \"torch byte-code: $(torch_bytecode)\"" ;;  # pass COMMIT=<sha>: the device copy's .git can be stale, so its HEAD is not evidence
    pyc)  # set-up, as a pip-installed environment has it: the runner's image ships its libraries without byte-code and
      # sets PYTHONDONTWRITEBYTECODE=1, so every process (16 workers, their subprocesses) compiles torch from source
      # (scripts/compile_bytecode.sh). Byte-code of the interpreter's libraries goes to a prefix; later steps use it.
      export PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-$(mktemp -d)}
      run_step pyc bash -c "scripts/compile_bytecode.sh $PY && du -sh $PYTHONPYCACHEPREFIX" ;;
    suite|suite-warm|suite-same|suite-same-noiso)  # the whole suite as `make test` runs it (tests/ and cases/), after one warmup, under
      # the recompile guard; suite starts from a cold Triton cache, suite-warm reuses the one the previous step filled.
      # suite-same (cold): only the test files the carried .baseline/ tree also has, and cases/: this code's cost on
      # the baseline's behaviours, apart from the tests added since. suite-same-noiso: the same with case items in the
      # worker's own process (--isolation none), so that a pair of the two measures what isolation costs.
      # TAG names the logs (e.g. -2gpu); PIN prefixes the command (e.g. "taskset -c 0-15" for a 16-core budget).
      # DURATIONS: an earlier report whose item durations order the work longest first (default: the checked-in one);
      # passed as one --durations-from=PATH token (and every --ssd-report as one): as a separate argument an existing
      # file outside the repository becomes part of pytest's rootdir search (run 58); the plugin now stops such a run
      # (ssd_pytest/arguments.py).
      # A cold run also starts without the repository's byte-code and pytest's rewritten modules (step pyc).
      [ "$step" != suite-warm ] && export TRITON_CACHE_DIR=$(mktemp -d) && rm -rf "${PYTHONPYCACHEPREFIX:-/nonexistent}$PWD"
      extra="${SUITE_ARGS:-}"
      # (ignoring the test files the baseline lacks, rather than naming the others: a long file list slows start-up)
      [ "$step" = suite-same-noiso ] && extra="$extra --isolation none"
      [ "${step#suite-same}" != "$step" ] && extra="$extra $(cd tests && ls test_*.py | while read f; do [ -f "../.baseline/tests/$f" ] || echo "--ignore=tests/$f"; done | tr '\n' ' ')"
      name=$(unique_name "$step${TAG:-}")
      start_samplers "$name"
      run_step "$name" ${PIN:-} $PY -m pytest -q -n "$WORKERS" --workers-per-gpu "${WPG:-$WORKERS}" --device cuda \
        -p no:cacheprovider --recompile-guard --durations-from="${DURATIONS:-scripts/gpu-durations.json}" --ssd-report="$OUT/$name-report.json" --junit-xml "$OUT/$name-junit.xml" \
        --durations 30 -rfE --tb=short $extra
      stop_samplers
      # A killed run leaves its workers' live parts; times merges them (and failures.txt keeps every failure's report).
      $PY -m harness times "$OUT/$name-report.json" --top 20 --by check --by family --by worker > "$OUT/$name-times.txt" 2>&1
      # merged into the report: dozens of part files would crowd out the logs
      findings "$OUT/$name-report.json" "$OUT/$name-failures.txt" && rm -rf "$OUT/$name-report.json.parts"
      head -n 1 "$OUT/$name-failures.txt" ;;
    readme|readme-warm)  # the README's GPU command as a user types it (docs/suite-speed.md): `python -m pytest -n auto
      # --device cuda`, plus --recompile-guard as the nightly workflow runs it and a report, in a source export of this
      # tree (its tracked and unignored files without .git, what `git archive` ships; outside any repository):
      # readme from a cold Triton cache and no byte-code, readme-warm again on what readme left. Prints the items,
      # the case items run, the distinct binaries compiled; the wall time is the step's.
      if [ "$step" = readme ]; then  # README_EXPORT / README_TRITON_CACHE: empty folders given by the caller, so that
        # a later call of this script can run readme-warm on them (each folder is made here where not given)
        export README_EXPORT=${README_EXPORT:-$(mktemp -d)} README_TRITON_CACHE=${README_TRITON_CACHE:-$(mktemp -d)}
        git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
          [ -f "$f" ] && printf '%s\0' "$f"; done | tar --null -T - -cf - | tar -xf - -C "$README_EXPORT"
      fi
      bytecode=$(torch_bytecode)
      run_step "$step" bash -c "cd '$README_EXPORT' && TRITON_CACHE_DIR='$README_TRITON_CACHE' $PY -m pytest -n auto \
        --device cuda --recompile-guard --ssd-report='$OUT/$step-report.json'"
      $PY -m harness times "$OUT/$step-report.json" --top 20 --by check --by worker > "$OUT/$step-times.txt" 2>&1
      findings "$OUT/$step-report.json" "$OUT/$step-summary.txt" && rm -rf "$OUT/$step-report.json.parts"
      head -n 1 "$OUT/$step-summary.txt"
      echo "torch byte-code: $bytecode" | tee -a "$OUT/$step-summary.txt"
      grep -E '^compiles:' "$OUT/$step-times.txt" | tee -a "$OUT/$step-summary.txt" ;;
    startup)  # where a worker's start-up goes: environment, imports, one collection (cold then warm byte-code
      # caches, and a cProfile of it), and 16 xdist workers that start, collect everything and run nothing
      run_step startup-env bash -c "env | grep -E '^(PYTHON|PYTEST)' ; echo dont_write_bytecode=\$($PY -c 'import sys; print(sys.dont_write_bytecode)')"
      run_step startup-imports bash -c "$PY -X importtime -c 'import ssd_pytest.plugin, triton' 2> $OUT/startup-importtime.txt; sort -t'|' -k2 -n $OUT/startup-importtime.txt | tail -n 12"
      find . -name __pycache__ -not -path './.git/*' -prune -exec rm -rf {} + ; rm -rf "${PYTHONPYCACHEPREFIX:-/nonexistent}$PWD"
      run_step startup-collect-cold $PY -m pytest --collect-only -q -p no:cacheprovider --device cuda
      run_step startup-collect-warm $PY -m pytest --collect-only -q -p no:cacheprovider --device cuda
      run_step startup-collect-prof bash -c "$PY -m cProfile -o $OUT/startup-collect.prof -m pytest --collect-only -q -p no:cacheprovider --device cuda >/dev/null; $PY -c \"import pstats; pstats.Stats('$OUT/startup-collect.prof').sort_stats('tottime').print_stats(30)\" | tail -n 40"
      run_step startup-xdist $PY -m pytest -q -n "$WORKERS" --workers-per-gpu "${WPG:-$WORKERS}" --device cuda -p no:cacheprovider -k no_test_has_this_name ;;
    tests)
      export TRITON_CACHE_DIR=$(mktemp -d)  # cold compile cache
      run_step tests $PY -m pytest tests -q -n "$WORKERS" --workers-per-gpu "$WORKERS" --device cuda -p no:cacheprovider \
        --junitxml "$OUT/tests-junit.xml" --durations 15 ;;
    cases)
      export TRITON_CACHE_DIR=$(mktemp -d)
      run_step cases $PY -m pytest cases -q -n "$WORKERS" --workers-per-gpu "$WORKERS" --device cuda -p no:cacheprovider \
        --ssd-report="$OUT/cases-report.json" --junitxml "$OUT/cases-junit.xml" ;;
    cases-warm)
      run_step cases-warm $PY -m pytest cases -q -n "$WORKERS" --workers-per-gpu "$WORKERS" --device cuda -p no:cacheprovider ;;
    warmup)  # the corpus warmup from a cold cache: compiled by WORKERS processes, then loaded in this one
      export TRITON_CACHE_DIR=$(mktemp -d)
      run_step warmup $PY -m harness warmup --device cuda --jobs "$WORKERS" ;;
    bench)
      run_step bench $PY -m harness bench --json "$OUT/bench.json" ;;
    profile-ref)  # where the slowest reference_bound item spends its time (cProfile, cumulative, top 45)
      run_step profile-ref bash -c "$PY -m cProfile -s cumtime -m harness repro cases/corpus/serving.yaml \
        --case serving-006-mixed-checkpoint-bf16-bf16 --check reference_bound --device cuda | head -n 80" ;;
    profile-warmup)  # where loading the corpus' specializations from a warm disk cache goes (a case's first item
      # pays it per worker): one process, after a suite step filled the cache
      run_step profile-warmup bash -c "$PY -m cProfile -o $OUT/warmup.prof -m harness warmup --device cuda --jobs 1 | tail -n 3; $PY -c \"import pstats; p = pstats.Stats('$OUT/warmup.prof'); p.sort_stats('cumulative').print_stats(45); p.sort_stats('tottime').print_stats(25)\" | grep -v '^$' | tail -n 80" ;;
    peer-bench)  # ours against vLLM's kernels (peers.vllm_ssd: ops from the carried .peers/ or an installed vllm) in one
      # process on the same inputs, calls alternating round by round: whole calls by graph replay (peer-bench), then
      # each stage's device time in one whole call, from torch.profiler (peer-stages); all four workloads, both of our
      # variants that the whole calls compare (indexed where a workload has one sequence, snapshot-fused)
      workloads="--workload short-continuation --workload prefill-4256 --workload continue-600 --workload mixed-3"
      run_step peer-bench $PY -m harness bench --peer peers.vllm_ssd:provider --rounds 3 $workloads \
        --json "$OUT/peer-bench.json"
      run_step peer-stages $PY -m harness bench --stages --peer peers.vllm_ssd:provider --rounds 3 $workloads \
        --variant indexed --variant snapshot-fused --json "$OUT/peer-stages.json" ;;
    bench-twice)  # the peer bench in two fresh processes: whole calls twice, and whether our kernels ran the same
      # configs in both (issue 18: configs must not depend on timing noise)
      workloads="--workload short-continuation --workload prefill-4256 --workload continue-600 --workload mixed-3"
      for i in 1 2; do
        run_step peer-bench-$i $PY -m harness bench --peer peers.vllm_ssd:provider --rounds 3 $workloads \
          --json "$OUT/peer-bench-$i.json"
      done
      run_step configs-diff bash -c "diff <(grep '^config ' $OUT/peer-bench-1.log) <(grep '^config ' $OUT/peer-bench-2.log) \
        && echo \"configs: the same $(grep -c '^config ' $OUT/peer-bench-1.log) tuning keys and configs in both processes\""
      run_step peer-stages $PY -m harness bench --stages --peer peers.vllm_ssd:provider --rounds 3 $workloads \
        --variant indexed --variant snapshot-fused --json "$OUT/peer-stages.json" ;;
    bench-nopdl)  # the peer bench and its stage profile with programmatic dependent launch off (SSD_PDL=0): what
      # the overlap of launches saves, against the same peer in the same process
      workloads="--workload short-continuation --workload prefill-4256 --workload continue-600 --workload mixed-3"
      run_step peer-bench-nopdl env SSD_PDL=0 $PY -m harness bench --peer peers.vllm_ssd:provider --rounds 3 \
        $workloads --json "$OUT/peer-bench-nopdl.json"
      run_step peer-stages-nopdl env SSD_PDL=0 $PY -m harness bench --stages --peer peers.vllm_ssd:provider \
        --rounds 3 $workloads --json "$OUT/peer-stages-nopdl.json" ;;
    stages)  # each stage of the four workloads (or STAGE_WORKLOADS, names separated by spaces) alone, as tuned and
      # with every candidate config forced, and the one config per stage with the least summed time (the proposal
      # for kernels/tuned_configs.py)
      workloads=$(for w in ${STAGE_WORKLOADS:-short-continuation prefill-4256 continue-600 mixed-3}; do echo "--workload $w"; done)
      run_step stages $PY -m harness bench --stages --reps 100 $workloads --json "$OUT/stages.json" ;;
    launch-tests)  # the tests of how the stages launch and what they compute, with the recompile guard: the graph
      # replays against the eager call (programmatic launch, bmm beside another kernel), the stages, both paths
      run_step launch-tests $PY -m pytest -q -n "$WORKERS" --workers-per-gpu "${WPG:-$WORKERS}" --device cuda \
        -p no:cacheprovider --recompile-guard -rfE --tb=short tests/test_programmatic_launch.py \
        tests/test_indexed_equivalence.py tests/test_ssd_prefill.py tests/test_kernel_stages.py \
        tests/test_ssd_warmup.py tests/test_state_passing.py ;;
    durations)  # the last suite step's item durations as scripts/gpu-durations.json (pytest --durations-from orders
      # the work longest first), each item's longest of them and the file's (a compiling test is slow only where it
      # compiles first): the later suite steps of this call use them; the file comes back in $OUT
      last=$(ls -t "$OUT"/suite*-report.json 2>/dev/null | head -n 1)
      run_step durations bash -c "$PY -m harness times $last --write-durations scripts/gpu-durations.json --longest-of scripts/gpu-durations.json | tail -n 3 \
        && cp scripts/gpu-durations.json $OUT/gpu-durations.json" ;;
    baseline)  # the suite as suite runs it, at an older commit's tree unpacked into .baseline/ (carried): the same
      # machine and session as the suite step, so the two cold times compare (BASE_REPORT_OPT: its report option)
      export TRITON_CACHE_DIR=$(mktemp -d)
      rm -rf "${PYTHONPYCACHEPREFIX:-/nonexistent}$PWD/.baseline"
      name=$(unique_name baseline)
      start_samplers "$name"
      run_step "$name" bash -c "cd .baseline && $PY -m pytest -q -n $WORKERS --workers-per-gpu ${WPG:-$WORKERS} \
        --device cuda -p no:cacheprovider --recompile-guard --durations-from=scripts/gpu-durations.json \
        ${BASE_REPORT_OPT:---json-report} $OUT/$name-report.json -rfE --tb=short"
      stop_samplers ;;
    faults)  # a real illegal memory access in one case (tiny-batch): that case errors, every other case passes
      python3 -c "import tests.broken_providers as b; open('/tmp/tiny.yaml', 'w').write(b.TINY_CASES)"
      export TRITON_CACHE_DIR=$(mktemp -d)
      run_step faults-cli $PY -m harness run /tmp/tiny.yaml --device cuda \
        --provider tests.faulty_providers:illegal_memory_access --json "$OUT/faults-cli.json"
      run_step faults-pytest $PY -m pytest /tmp/tiny.yaml -p ssd_pytest.plugin --rootdir . -q -n 4 --workers-per-gpu 4 \
        --device cuda -p no:cacheprovider \
        --provider tests.faulty_providers:illegal_memory_access --ssd-report="$OUT/faults-pytest.json" -rfE --tb=line ;;
    vllm-corpus)  # the whole corpus against vLLM's kernels (peers.vllm_ssd, ops from the carried .peers/), under the
      # recompile guard (the adapter's warmup hook) unless VLLM_ARGS says otherwise; autotune_idempotent runs always
      export TRITON_CACHE_DIR=$(mktemp -d)
      run_step vllm-corpus $PY -m pytest cases -q -n "$WORKERS" --workers-per-gpu "${WPG:-$WORKERS}" --device cuda \
        -p no:cacheprovider --provider peers.vllm_ssd:provider --ssd-report="$OUT/vllm-report.json" -rfE --tb=line \
        ${VLLM_ARGS---recompile-guard}
      findings "$OUT/vllm-report.json" "$OUT/vllm-failures.txt" && rm -rf "$OUT/vllm-report.json.parts"
      head -n 1 "$OUT/vllm-failures.txt" ;;
    every-config|every-config-vllm|every-config-vllm-all)  # every_config (docs/checks.md#every_config) over the corpus
      # and the regressions: every config of every autotuner the call reaches, forced. every-config: our kernels;
      # every-config-vllm: vLLM 0.33's stock ops (ops from the carried .peers/); every-config-vllm-all: the same with
      # SSD_HARNESS_VLLM_KEEP_RACY_CONFIGS=1 (_drop_racy_wgmma_configs as the identity: all 23 chunk-scan configs).
      # A cold Triton cache: every forced config compiles once per specialization (set STEP_TIMEOUT to fit). Named by
      # --check: a GPU run that does not name every_config skips it outside the cases whose checks: name it.
      # EVERY_CONFIG_CACHE: one Triton cache for every step that names it, in this call or a later one on the same
      # warm machine (a step compiles only the configs an earlier one did not), else a cold one per step.
      # SHARD=K/N: only shard K of N of the cases (pytest's --shard: whole cases, the same split in every call at one
      # commit), so that a sweep longer than one device call runs as N calls whose reports together cover the
      # corpus; its logs and report are named <step>-shard-K-of-N, and shard 1 alone reruns the serving shapes.
      export TRITON_CACHE_DIR=${EVERY_CONFIG_CACHE:-$(mktemp -d)}
      provider=(); keep=0; name=$step; shard=()
      [ "$step" != every-config ] && provider=(--provider peers.vllm_ssd:provider)
      [ "$step" = every-config-vllm-all ] && keep=1
      [ -n "${SHARD:-}" ] && name="$step-shard-${SHARD%%/*}-of-${SHARD#*/}" && shard=(--shard "$SHARD")
      SSD_HARNESS_VLLM_KEEP_RACY_CONFIGS=$keep run_step "$name" $PY -m pytest cases -q --check every_config -n "$WORKERS" \
        --workers-per-gpu "$WORKERS" --device cuda -p no:cacheprovider "${provider[@]}" "${shard[@]}" \
        --ssd-report="$OUT/$name-report.json" -rfE --tb=line
      findings "$OUT/$name-report.json" "$OUT/$name-findings.txt" reasons && rm -rf "$OUT/$name-report.json.parts"
      head -n 1 "$OUT/$name-findings.txt"
      # The serving shapes again from the now warm cache, each item's stats printed: the configs forced and those
      # not runnable on this device (pytest's report keeps outcomes, not stats)
      if [ -z "${SHARD:-}" ] || [ "${SHARD%%/*}" = 1 ]; then
        SSD_HARNESS_VLLM_KEEP_RACY_CONFIGS=$keep run_step "$name-serving" $PY -m harness repro \
          cases/regressions/every-config-serving-shapes.yaml --check every_config --device cuda "${provider[@]}"
      fi ;;
    fuzz-vllm)  # the fuzzer against vLLM's kernels: a fault is a finding, shrunk in fresh children and written as YAML;
      # then repro of each file it wrote (FUZZ_SECONDS: the search's wall-time budget)
      export TRITON_CACHE_DIR=$(mktemp -d)
      run_step fuzz-vllm $PY -m harness fuzz --device cuda --provider peers.vllm_ssd:provider --budget 400 \
        --time-budget "${FUZZ_SECONDS:-240}" --heartbeat 10 --out "$OUT/fuzz-vllm"
      for found in "$OUT"/fuzz-vllm/*.yaml; do
        [ -f "$found" ] && run_step fuzz-vllm-repro $PY -m harness repro "$found" --device cuda \
          --provider peers.vllm_ssd:provider
      done ;;
    *)
      echo "unknown step $step" >&2; exit 2 ;;  # not reached: the names were checked above
  esac
done
# The device tool brings back at most 8 files: pack every log and report into one archive.
if [ "${PACK:-1}" = 1 ]; then
  mapfile -t written < <(cd "$OUT" && ls -A | grep -vxF -f <(printf '%s\n' "${callers[@]}"))
  if [ "${#written[@]}" -gt 0 ]; then
    name=logs.tgz n=2
    while [ -e "$OUT/$name" ]; do name="logs-$n.tgz"; n=$((n + 1)); done
    archive=$(mktemp -d)/$name
    tar czf "$archive" -C "$OUT" -- "${written[@]}" && (cd "$OUT" && rm -rf -- "${written[@]}") && mv "$archive" "$OUT/$name"
  fi
fi
echo "==== summary"
printf '%s\n' "${summary[@]}"
