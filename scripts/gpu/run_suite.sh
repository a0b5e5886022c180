#!/usr/bin/env bash
# Runs the GPU tests and benchmarks on a GPU machine and writes a short results table plus full logs.
#
#   scripts/gpu/run_suite.sh [CARRY_DIR or CARRY_DIR-pack/carry.tar.gz] [OUT_DIR]
#
# CARRY_DIR: what scripts/gpu/build.sh produced (default build/gpu-carry); OUT_DIR: where results go
# (default $OUT, else out/gpu). Files written: results.md (the table, also printed last), tests.log,
# <bench>.log per benchmark. Every bin/*_test and bin/gpu_*_bench is run; SKIP_BENCH=1 skips the
# benchmarks, BENCHES="gpu_a_bench gpu_b_bench" restricts them, BENCH_TIMEOUT (s) bounds each,
# GTEST_FILTER applies to the tests, TESTS="cuda_distributed_* other_test" (shell patterns) picks the test
# binaries, TEST_TIMEOUT (s, default 300) bounds each. Exit status: non-zero when a test binary failed.
#
# Environment (docs/gpu.md): cuDNN/NCCL/cuBLAS from the machine's Python venv when present (the
# system cuDNN 9.14 has a known sliding-window bug), NVLink multicast off.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CARRY_DIR="${1:-$ROOT/build/gpu-carry}"
if [[ "$CARRY_DIR" == *.tar.gz ]]; then  # build.sh's packed carry: unpack it into a temporary folder
  unpack="$(mktemp -d)"
  tar -xzf "$CARRY_DIR" -C "$unpack" || exit 1
  CARRY_DIR="$(find "$unpack" -mindepth 1 -maxdepth 1 -type d | head -1)"
fi
OUT_DIR="${2:-${OUT:-$ROOT/out/gpu}}"
mkdir -p "$OUT_DIR"

source "$ROOT/scripts/gpu/machine_env.sh"
cpf_gpu_env "$CARRY_DIR/lib"

results="$OUT_DIR/results.md"
tests_log="$OUT_DIR/tests.log"
: >"$tests_log"
device="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
{
  echo "# cpformer GPU suite"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- device: ${device:-unknown (nvidia-smi failed)}"
  echo "- host: $(uname -n), $(nproc) cores"
  echo
  echo "| test binary | result | passed | failed | skipped | seconds |"
  echo "| --- | --- | --- | --- | --- | --- |"
} >"$results"

status=0
wanted_test() {
  local -; set -f  # TESTS holds patterns, not files
  local pattern
  [[ -z "${TESTS:-}" ]] && return 0
  for pattern in $TESTS; do [[ "$1" == $pattern ]] && return 0; done
  return 1
}
for exe in "$CARRY_DIR"/bin/*_test; do
  name="$(basename "$exe")"
  wanted_test "$name" || continue
  start=$(date +%s)
  log="$(timeout "${TEST_TIMEOUT:-300}" "$exe" --gtest_color=no 2>&1)"
  rc=$?
  secs=$(( $(date +%s) - start ))
  { echo "===== $name (exit $rc)"; echo "$log"; } >>"$tests_log"
  passed="$(echo "$log" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -1)"
  failed="$(echo "$log" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -1)"
  skipped="$(echo "$log" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | tail -1)"
  result=PASS
  if [[ $rc -ne 0 ]]; then result="FAIL (exit $rc)"; status=1; fi
  echo "| $name | $result | ${passed:-0} | ${failed:-0} | ${skipped:-0} | $secs |" >>"$results"
done

bench() {
  local exe="$1" name log
  name="$(basename "$exe")"
  log="$OUT_DIR/${name}.log"
  timeout "${BENCH_TIMEOUT:-300}" "$exe" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true >"$log" 2>&1
  local rc=$?
  {
    echo
    echo "## $name (exit $rc)"
    echo
    echo '```'
    # The summary table each benchmark prints last: its header names the medians or says "summary".
    # (or, for a program that prints only its own table, the log's last lines).
    if grep -qE '\(median\)|[Ss]ummary' "$log"; then awk '/\(median\)|[Ss]ummary/ {on = 1} on' "$log"; else tail -n 15 "$log"; fi
    echo '```'
  } >>"$results"
}
if [[ -z "${SKIP_BENCH:-}" ]]; then
  for exe in "$CARRY_DIR"/bin/gpu_*_bench; do
    [[ -e "$exe" ]] || continue
    if [[ -n "${BENCHES:-}" && " $BENCHES " != *" $(basename "$exe") "* ]]; then continue; fi
    bench "$exe"
  done
fi

cat "$results"
exit $status
