#!/usr/bin/env bash
# The multi-GPU suite, benchmarks and training scaling on one machine of 2 or 4 GPUs (nvidia-h200-x2 or
# -x4), in one call, so the device time pays for one machine start:
#
#   scripts/gpu/multi_gpu.sh CARRY OUT_DIR
#   STAGES="tests bench scaling" SINGLE_GPU_SUITE=1 VARIANT=path/to/variant scripts/gpu/multi_gpu.sh ...
#
# CARRY: scripts/gpu/build.sh's folder or its carry.tar.gz. OUT_DIR gets summary.md (also printed) and
# logs.tar.gz (every log): the device tool brings back at most 8 files.
# Stages (STAGES, default all three, in this order):
#   tests    cuda_distributed_* with GPUs 0,1 visible, then with all of them when there are 4. With
#            SINGLE_GPU_SUITE=1 every other test binary runs meanwhile on the last GPU (its own process,
#            so the multi-GPU tests only share that GPU on 4-GPU runs).
#   bench    gpu_nccl_bench and gpu_cp_bench on 2 GPUs, then on 4 (MULTI_BENCHES picks).
#   scaling  scripts/gpu/train_scaling.sh (cpformer --gpus 1, 2, 4).
# VARIANT: a folder with bin/ and lib/ built from another branch (only what differs, e.g. its
# libcpf_distributed_nccl.so and the tests it changed): copied over a copy of the carry, whose
# cuda_distributed_* tests then run again at the end of the tests stage (binaries load the libraries
# of their folder's lib/), and its gpu_nccl_bench after ours in the bench stage.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CARRY="${1:?usage: multi_gpu.sh CARRY OUT_DIR}"
OUT_DIR="${2:?usage: multi_gpu.sh CARRY OUT_DIR}"
STAGES="${STAGES:-tests bench scaling}"
work="${WORK:-$(mktemp -d)}"  # WORK: keep the logs somewhere known (e.g. to pack them after a timeout)
mkdir -p "$work"
if [[ "$CARRY" == *.tar.gz ]]; then
  tar -xzf "$CARRY" -C "$work" || exit 1
  CARRY="$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -1)"
fi
logs="$work/logs"
mkdir -p "$logs" "$OUT_DIR"
export NCCL_NVLS_ENABLE=0
gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
summary="$OUT_DIR/summary.md"
echo "# multi-GPU run, $(date -u +%Y-%m-%dT%H:%M:%SZ), ${gpus} x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" >"$summary"
counts=(2)
[[ "$gpus" -ge 4 ]] && counts+=(4)
visible() { seq -s, 0 $(($1 - 1)); }

variant="$work/variant"
if [[ -n "${VARIANT:-}" ]]; then
  cp -r "$CARRY" "$variant" && cp -r "$ROOT/$VARIANT"/. "$variant"/
fi

section() {  # title, results file
  { echo; echo "## $1"; echo; sed -n '/^| /p' "$2"; } >>"$summary"
}

if [[ " $STAGES " == *" tests "* ]]; then
  single_pid=
  if [[ -n "${SINGLE_GPU_SUITE:-}" ]]; then
    single="$(ls "$CARRY"/bin/*_test | xargs -n1 basename | grep -v '^cuda_distributed_' | tr '\n' ' ')"
    CUDA_VISIBLE_DEVICES=$((gpus - 1)) TESTS="$single" SKIP_BENCH=1 \
      "$ROOT/scripts/gpu/run_suite.sh" "$CARRY" "$logs/single" >/dev/null 2>&1 &
    single_pid=$!
  fi
  for n in "${counts[@]}"; do
    CUDA_VISIBLE_DEVICES=$(visible "$n") TESTS="cuda_distributed_*" SKIP_BENCH=1 \
      "$ROOT/scripts/gpu/run_suite.sh" "$CARRY" "$logs/tests_${n}gpu" >/dev/null 2>&1
    section "cuda_distributed_* on $n GPUs" "$logs/tests_${n}gpu/results.md"
  done
  if [[ -n "${VARIANT:-}" ]]; then
    CUDA_VISIBLE_DEVICES=$(visible "${counts[-1]}") TESTS="cuda_distributed_*" SKIP_BENCH=1 \
      "$ROOT/scripts/gpu/run_suite.sh" "$variant" "$logs/variant" >/dev/null 2>&1
    section "variant $VARIANT on ${counts[-1]} GPUs" "$logs/variant/results.md"
  fi
  if [[ -n "$single_pid" ]]; then
    wait "$single_pid"
    section "one-GPU suite (GPU $((gpus - 1)))" "$logs/single/results.md"
  fi
fi

if [[ " $STAGES " == *" bench "* ]]; then
  for n in "${counts[@]}"; do
    CUDA_VISIBLE_DEVICES=$(visible "$n") BENCHES="${MULTI_BENCHES:-gpu_nccl_bench gpu_cp_bench}" \
      BENCH_TIMEOUT="${BENCH_TIMEOUT:-300}" TESTS=none \
      "$ROOT/scripts/gpu/run_suite.sh" "$CARRY" "$logs/bench_${n}gpu" >/dev/null 2>&1
    { echo; echo "## benchmarks on $n GPUs"; sed -n '/^## gpu_/,$p' "$logs/bench_${n}gpu/results.md"; } >>"$summary"
    variant_benches="$(ls "$variant/bin" 2>/dev/null | grep '^gpu_nccl_bench$')"
    if [[ -n "${VARIANT:-}" && -n "$variant_benches" ]]; then
      CUDA_VISIBLE_DEVICES=$(visible "$n") BENCHES="$variant_benches" TESTS=none \
        "$ROOT/scripts/gpu/run_suite.sh" "$variant" "$logs/variant_bench_${n}gpu" >/dev/null 2>&1
      { echo; echo "## variant $VARIANT benchmarks on $n GPUs"; sed -n '/^## gpu_/,$p' "$logs/variant_bench_${n}gpu/results.md"; } >>"$summary"
    fi
  done
fi

if [[ " $STAGES " == *" scaling "* ]]; then
  "$ROOT/scripts/gpu/train_scaling.sh" "$CARRY/bin/cpformer" "$logs/scaling" >/dev/null 2>&1
  { echo; cat "$logs/scaling/train_scaling.md"; } >>"$summary"
fi

tar -C "$work" -czf "$OUT_DIR/logs.tar.gz" logs
cat "$summary"
