#!/usr/bin/env bash
# Training throughput of the 124M GPT on 1, 2 and 4 GPUs of one machine (NCCL, `cpformer train --gpus N`):
#
#   dp  configs/gpu_gpt2_124m.yaml     seq 1024, 32 rows per GPU, parallel.dp = N  (weak scaling: the
#                                      global batch grows with N)
#   cp  configs/gpu_gpt2_124m_cp.yaml  seq 32768, one row per step, parallel.cp = N (strong scaling: the
#                                      same row split over N GPUs; CP_COMM picks the strategy, default p2p)
#
#   scripts/gpu/train_scaling.sh [CPFORMER] [OUT_DIR]
#   GPUS="1 2 4" STEPS=20 LOG_EVERY=10 CP_COMM=p2p CASES="dp cp" CPF_SET="k=v ..." scripts/gpu/train_scaling.sh
# CPF_SET adds --set overrides to every run (e.g. parallel.cp_a2a_head_groups=1).
#
# CPFORMER: the binary (default: build/gpu-carry/bin/cpformer from `WITH_APPS=1 scripts/gpu/build.sh`, else
# build/gpu/apps/cpformer); OUT_DIR (default $OUT, else out/train_scaling) receives train_scaling.md (the
# table, also printed), one log per run and the nvidia-smi samples. GPU counts above the visible GPUs
# are skipped.
#
# Figures, per run, from the last metrics.jsonl step line (the window of steps STEPS-LOG_EVERY+1 .. STEPS,
# after the first window's warm-up):
#   tokens/s     the trainer's global tokens per second (every DP rank's rows; CP ranks share a row)
#   efficiency   tokens/s(N) / (N x tokens/s(1)) of the same case
#   peak alloc   the caching allocator's peak on rank 0's GPU (peak_memory_bytes; the trainer reports
#                rank 0 only: DP ranks are identical, CP ranks hold equal shards)
#   max used     per GPU, the largest memory.used nvidia-smi sampled every 200 ms during the run
#                (allocator reserve + CUDA context + NCCL buffers): every rank's footprint
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CPFORMER="${1:-}"
if [[ -z "$CPFORMER" ]]; then
  CPFORMER="$ROOT/build/gpu-carry/bin/cpformer"
  [[ -x "$CPFORMER" ]] || CPFORMER="$ROOT/build/gpu/apps/cpformer"
fi
OUT_DIR="${2:-${OUT:-$ROOT/out/train_scaling}}"
GPUS="${GPUS:-1 2 4}"
STEPS="${STEPS:-20}"
LOG_EVERY="${LOG_EVERY:-10}"
CP_COMM="${CP_COMM:-p2p}"
CASES="${CASES:-dp cp}"  # which of the two cases run
if [[ ! -x "$CPFORMER" ]]; then
  echo "train_scaling.sh: no cpformer binary at $CPFORMER (build it: WITH_APPS=1 scripts/gpu/build.sh)" >&2
  exit 1
fi
mkdir -p "$OUT_DIR"

source "$ROOT/scripts/gpu/machine_env.sh"
cpf_gpu_env "$(dirname "$CPFORMER")/../lib"

visible="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
device="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
table="$OUT_DIR/train_scaling.md"
{
  echo "# Training throughput, 124M GPT ($(date -u +%Y-%m-%dT%H:%M:%SZ), ${visible} x ${device:-unknown GPU})"
  echo
  echo "\`scripts/gpu/train_scaling.sh\`: STEPS=$STEPS, LOG_EVERY=$LOG_EVERY (figures of steps $((STEPS - LOG_EVERY + 1))-$STEPS), CP_COMM=$CP_COMM, bf16, NCCL"
  echo
  echo "| case | GPUs | layout | tokens/s | efficiency | peak alloc rank 0 (GiB) | max used per GPU (GiB) | exit |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$table"

# A field of the last step line of metrics.jsonl ("" when absent).
metric() {
  grep '"lr"' "$1" 2>/dev/null | tail -1 | sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p"
}

declare -A base_tps  # case key -> tokens/s on 1 GPU

# run_case KEY LABEL CONFIG GPUS LAYOUT [--set ...]
run_case() {
  local key="$1" label="$2" config="$3" gpus="$4" layout="$5"
  shift 5
  local name="${key}_gpu${gpus}"
  local dir="$OUT_DIR/runs/$name"
  rm -rf "$dir"
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 200 >"$OUT_DIR/$name.smi" 2>/dev/null &
  local smi=$!
  echo "== $name: $CPFORMER train $config --gpus $gpus $*"
  local extra=()
  for kv in ${CPF_SET:-}; do extra+=(--set "$kv"); done
  "$CPFORMER" train "$config" --gpus "$gpus" --set "run.out_dir=$dir" --set "run.steps=$STEPS" \
    --set "run.log_every=$LOG_EVERY" "$@" "${extra[@]}" >"$OUT_DIR/$name.log" 2>&1
  local rc=$?
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
  grep -E '^(step|done|cpformer)' "$OUT_DIR/$name.log" | tail -4
  local tps peak used eff="-"
  tps="$(metric "$dir/metrics.jsonl" tokens_per_s)"
  peak="$(metric "$dir/metrics.jsonl" peak_memory_bytes)"
  # Max memory.used (MiB) per GPU index among the first $gpus GPUs, as "0: 12.3, 1: 12.1".
  used="$(awk -F', *' -v n="$gpus" '$1 < n { if ($2 > m[$1]) m[$1] = $2 }
           END { for (i = 0; i < n; i++) printf "%s%d: %.1f", (i ? ", " : ""), i, m[i] / 1024 }' "$OUT_DIR/$name.smi")"
  if [[ -n "$tps" && "$gpus" == 1 ]]; then base_tps[$key]="$tps"; fi
  if [[ -n "$tps" && -n "${base_tps[$key]:-}" ]]; then
    eff="$(awk -v t="$tps" -v b="${base_tps[$key]}" -v n="$gpus" 'BEGIN { printf "%.1f%%", 100 * t / (n * b) }')"
  fi
  local tps_text="-" peak_text="-"
  [[ -n "$tps" ]] && tps_text="$(awk -v t="$tps" 'BEGIN { printf "%.0f", t }')"
  [[ -n "$peak" ]] && peak_text="$(awk -v p="$peak" 'BEGIN { printf "%.2f", p / 1073741824 }')"
  echo "| $label | $gpus | $layout | $tps_text | $eff | $peak_text | $used | $rc |" >>"$table"
  rm -rf "$dir/checkpoints"  # 124M weights + AdamW state per run; the logs and metrics stay
}

for g in $GPUS; do
  [[ " $CASES " == *" dp "* ]] || break
  if (( g > visible )); then echo "== skipping $g GPUs: $visible visible"; continue; fi
  run_case dp_seq1024 "dp, seq 1024" "$ROOT/configs/gpu_gpt2_124m.yaml" "$g" "dp=$g" --set parallel.cp=1
done
for g in $GPUS; do
  [[ " $CASES " == *" cp "* ]] || break
  if (( g > visible )); then continue; fi
  run_case cp_seq32768 "cp, seq 32768" "$ROOT/configs/gpu_gpt2_124m_cp.yaml" "$g" "cp=$g ($CP_COMM)" --set "parallel.cp=$g" \
    --set "parallel.cp_comm_type=$CP_COMM"
done

echo
cat "$table"
