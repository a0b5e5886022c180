#!/usr/bin/env bash
# One-GPU training throughput of cpformer against PyTorch on the same GPU, in one device call:
#
#   scripts/gpu/train_vs_torch.sh [CPFORMER] [OUT_DIR]
#   STEPS=40 LOG_EVERY=20 ROWS=32 PEER=peers/gpt2_torch.py PROFILE=1 scripts/gpu/train_vs_torch.sh
#
# cpformer trains configs/gpu_gpt2_124m.yaml (GPT-2 124M's shape: seq 1024, ROWS rows, bf16); the peer
# is a PyTorch program of the same shape (bf16 autocast, fused AdamW, SDPA) run eager and under
# torch.compile. PEER names it (default peers/gpt2_torch.py: a copy of the measuring program kept
# outside the repository, carried to the GPU machine; without it only cpformer's figures are printed).
# Prints and writes OUT_DIR/train_vs_torch.md: tokens/s, peak memory and cpformer / peer ratios.
# CPF_SET="key=value ..." adds --set overrides to cpformer's run (e.g. run.profile=3 prints cpformer's
# own per-op table, docs/training.md). PROFILE=1 adds an Nsight Compute per-kernel time table of 3 cpformer steps (OUT_DIR/kernels.csv and
# the top rows, grouped by kernel, in the table file).
#
# CPFORMER: default build/gpu-carry/bin/cpformer (`WITH_APPS=1 scripts/gpu/build.sh`); OUT_DIR: default
# $OUT, else out/train_vs_torch.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CPFORMER="${1:-$ROOT/build/gpu-carry/bin/cpformer}"
OUT_DIR="${2:-${OUT:-$ROOT/out/train_vs_torch}}"
STEPS="${STEPS:-40}"
LOG_EVERY="${LOG_EVERY:-20}"
ROWS="${ROWS:-32}"
PEER="${PEER:-$ROOT/peers/gpt2_torch.py}"
CONFIG="${CONFIG:-$ROOT/configs/gpu_gpt2_124m.yaml}"
if [[ ! -x "$CPFORMER" ]]; then
  echo "train_vs_torch.sh: no cpformer binary at $CPFORMER (build it: WITH_APPS=1 scripts/gpu/build.sh)" >&2
  exit 1
fi
mkdir -p "$OUT_DIR"

source "$ROOT/scripts/gpu/machine_env.sh"
cpf_gpu_env "$(dirname "$CPFORMER")/../lib"

device="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
table="$OUT_DIR/train_vs_torch.md"

# A field of the last step line of metrics.jsonl ("" when absent).
metric() { grep '"lr"' "$1" 2>/dev/null | tail -1 | sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p"; }

run_dir="$OUT_DIR/runs/gpt2"
rm -rf "$run_dir"
echo "== cpformer: $CPFORMER train $CONFIG (steps $STEPS, rows $ROWS)"
extra=()
for kv in ${CPF_SET:-}; do extra+=(--set "$kv"); done
"$CPFORMER" train "$CONFIG" --set "run.out_dir=$run_dir" --set "run.steps=$STEPS" --set "run.log_every=$LOG_EVERY" \
  --set "data.batch_size=$ROWS" "${extra[@]}" >"$OUT_DIR/cpformer.log" 2>&1
cpf_exit=$?
tail -3 "$OUT_DIR/cpformer.log"
cpf_tps="$(metric "$run_dir/metrics.jsonl" tokens_per_s)"
cpf_peak="$(metric "$run_dir/metrics.jsonl" peak_memory_bytes)"
cpf_peak_gib="$(awk -v b="${cpf_peak:-0}" 'BEGIN { printf "%.1f", b / 2^30 }')"

# peer MODE -> "tokens/s peak_GiB" from its one summary line ("tok/s=490,123 ... mem=15.1GiB")
peer() {
  [[ -f "$PEER" ]] || return 0
  echo "== peer: $PYTHON $PEER $ROWS $1" >&2
  "$PYTHON" "$PEER" "$ROWS" "$1" >"$OUT_DIR/peer_$1.log" 2>&1
  local line
  line="$(grep 'tok/s=' "$OUT_DIR/peer_$1.log" | tail -1)"
  echo "$line" >&2
  echo "$(sed -n 's/.*tok\/s=\([0-9,]*\).*/\1/p' <<<"$line" | tr -d ,) $(sed -n 's/.*mem=\([0-9.]*\)GiB.*/\1/p' <<<"$line")"
}
PEER_MODES="${PEER_MODES:-eager compile}"  # which PyTorch runs to make
eager_tps="" compile_tps=""
[[ " $PEER_MODES " == *" eager "* ]] && read -r eager_tps eager_peak <<<"$(peer eager)"
[[ " $PEER_MODES " == *" compile "* ]] && read -r compile_tps compile_peak <<<"$(peer compile)"
ratio() { [[ -n "$1" && -n "$2" ]] && awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b }'; }

{
  echo "# Training throughput, GPT-2 124M shape, one GPU ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo
  echo "- device: ${device:-unknown}"
  echo "- cpformer: \`$(basename "$CPFORMER") train $(basename "$CONFIG")\`, $ROWS rows x 1024 tokens, bf16, steps $STEPS, figures of the last $LOG_EVERY steps (exit $cpf_exit)"
  echo "- peer: \`$(basename "$PEER") $ROWS eager|compile\` (bf16 autocast, fused AdamW, SDPA)"
  echo
  echo "| run | tokens/s | peak memory (GiB) | cpformer / run |"
  echo "| --- | --- | --- | --- |"
  echo "| cpformer | ${cpf_tps:-failed} | $cpf_peak_gib | 1.00x |"
  [[ -n "${eager_tps:-}" ]] && echo "| PyTorch eager | $eager_tps | $eager_peak | $(ratio "$cpf_tps" "$eager_tps") |"
  [[ -n "${compile_tps:-}" ]] && echo "| PyTorch torch.compile | $compile_tps | $compile_peak | $(ratio "$cpf_tps" "$compile_tps") |"
} >"$table"

if [[ "${PROFILE:-0}" == 1 ]] && command -v ncu >/dev/null; then
  echo "== ncu: 3 steps, per-kernel GPU time"
  ncu --metrics gpu__time_duration.sum --print-summary per-kernel --csv \
    "$CPFORMER" train "$CONFIG" --set "run.out_dir=$OUT_DIR/runs/profile" --set run.steps=3 --set run.log_every=1 \
    --set schedule.warmup_steps=1 --set "data.batch_size=$ROWS" >"$OUT_DIR/kernels.csv" 2>"$OUT_DIR/ncu.log"
  {
    echo
    echo "## Kernels of 3 steps (Nsight Compute, gpu__time_duration.sum; kernels serialised)"
    echo
    echo "| kernel | calls | total ms | share |"
    echo "| --- | --- | --- | --- |"
    # CSV rows: "ID","Kernel Name",...,"Metric Name","Metric Unit","Minimum","Maximum","Average"(ns or us)
    awk -F'","' 'NR > 1 && $0 ~ /gpu__time_duration.sum/ {
        name = $5; gsub(/\(.*/, "", name); unit = $(NF-3); avg = $NF; gsub(/[",]/, "", avg); calls = $4;
        scale = unit ~ /^us/ ? 1e-3 : (unit ~ /^ms/ ? 1 : 1e-6); t[name] += avg * calls * scale; c[name] += calls; total += avg * calls * scale }
      END { for (k in t) printf "%s\t%d\t%.2f\t%.1f%%\n", k, c[k], t[k], 100 * t[k] / total; printf "TOTAL\t0\t%.2f\t100%%\n", total }' \
      "$OUT_DIR/kernels.csv" | sort -t$'\t' -k3,3 -rn | head -30 | awk -F'\t' '{ printf "| %s | %s | %s | %s |\n", substr($1, 1, 90), $2, $3, $4 }'
  } >>"$table"
fi
cat "$table"
[[ "$cpf_exit" == 0 ]]
