#!/usr/bin/env bash
# Long-context training on one GPU, cpformer against PyTorch in the same device call (docs/long_context.md):
#
#   scripts/gpu/long_context.sh [CPFORMER] [OUT_DIR]
#   RUNS="none:8192 full:131072" PEER_RUNS="compile:none:8192 compile:ckpt:65536" scripts/gpu/long_context.sh
#
# cpformer trains configs/llama3_1b_long.yaml (Llama-3.2-1B's shape) with the GPT-2 vocabulary padded to
# 50304 (the shape the issue measured; VOCAB overrides), batch 1, bf16, for STEPS steps; each RUNS entry is
# RECOMPUTE:SEQ_LEN. The peer is peers/llama_torch.py (a measuring program kept outside the repository and
# carried to the GPU machine): each PEER_RUNS entry is MODE:CKPT:SEQ_LEN (MODE eager|compile, CKPT ckpt|none).
# An empty RUNS or PEER_RUNS runs none of that kind (unset: the defaults below).
# Prints and writes OUT_DIR/long_context.md: tokens/s, MFU (cpformer's, against the dense bf16 peak), the
# measured peak and the planner's estimate, or OOM. CONFIG, LAYERS (model.num_layers) and CPF_SET
# ("key=value ...") change the model.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CPFORMER="${1:-$ROOT/build/gpu-carry/bin/cpformer}"
OUT_DIR="${2:-${OUT:-$ROOT/out/long_context}}"
CONFIG="${CONFIG:-$ROOT/configs/llama3_1b_long.yaml}"
STEPS="${STEPS:-4}"
VOCAB="${VOCAB:-50304}"
RUNS="${RUNS-none:8192 none:16384 full:32768 full:131072}"
PEER="${PEER:-$ROOT/peers/llama_torch.py}"
PEER_RUNS="${PEER_RUNS-compile:none:8192 compile:none:16384 compile:ckpt:32768 compile:ckpt:65536}"
mkdir -p "$OUT_DIR"
source "$ROOT/scripts/gpu/machine_env.sh"
cpf_gpu_env "$(dirname "$CPFORMER")/../lib"
device="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)"
table="$OUT_DIR/long_context.md"
metric() { grep '"lr"' "$1" 2>/dev/null | tail -1 | sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p"; }
gib() { awk -v b="${1:-0}" 'BEGIN { if (b > 0) printf "%.1f", b / 2^30; else printf "-" }'; }

{
  echo "# Long-context training, one GPU ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo
  echo "- device: ${device:-unknown}"
  echo "- cpformer: \`cpformer train $(basename "$CONFIG") --set model.vocab_size=$VOCAB ${CPF_SET:-}\`, batch 1, bf16, $STEPS steps, figures of the last steps"
  echo "- peer: \`$(basename "$PEER") SEQ MODE CKPT\` (bf16 autocast, fused AdamW, SDPA, torch.utils.checkpoint per block)"
  echo
  echo "| run | recompute | seq_len | tokens/s | MFU | peak GiB | model GiB |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
} >"$table"

extra=()
for kv in ${CPF_SET:-}; do extra+=(--set "$kv"); done
for run in $RUNS; do
  mode="${run%%:*}" seq="${run##*:}"
  dir="$OUT_DIR/runs/${mode}_$seq"
  rm -rf "$dir"
  echo "== cpformer recompute=$mode seq_len=$seq"
  "$CPFORMER" train "$CONFIG" --set "run.out_dir=$dir" --set "run.steps=$STEPS" --set "run.log_every=$((STEPS / 2))" \
    --set schedule.warmup_steps=1 --set "model.vocab_size=$VOCAB" --set "model.recompute=$mode" --set "data.seq_len=$seq" "${extra[@]}" \
    >"$OUT_DIR/cpformer_${mode}_$seq.log" 2>&1
  rc=$?
  tail -2 "$OUT_DIR/cpformer_${mode}_$seq.log"
  tps="$(metric "$dir/metrics.jsonl" tokens_per_s)"
  mfu="$(metric "$dir/metrics.jsonl" mfu)"
  [[ $rc != 0 ]] && grep -qi "out of memory\|does not fit\|estimates" "$OUT_DIR/cpformer_${mode}_$seq.log" && tps="OOM/refused"
  rm -rf "$dir/checkpoints"  # 13 GB for the 1B shape: the disk holds few
  echo "| cpformer | $mode | $seq | ${tps:-failed (exit $rc)} | $(awk -v m="${mfu:-0}" 'BEGIN { if (m > 0) printf "%.1f%%", 100 * m }') | $(gib "$(metric "$dir/metrics.jsonl" peak_memory_bytes)") | $(gib "$(metric "$dir/metrics.jsonl" memory_model_bytes)") |" >>"$table"
done

if [[ -f "$PEER" ]]; then
  for run in $PEER_RUNS; do
    IFS=: read -r pmode ckpt seq <<<"$run"
    echo "== peer $pmode $ckpt $seq"
    "$PYTHON" "$PEER" "$seq" "$pmode" "$ckpt" >"$OUT_DIR/peer_${pmode}_${ckpt}_$seq.log" 2>&1
    line="$(grep 'torch llama' "$OUT_DIR/peer_${pmode}_${ckpt}_$seq.log" | tail -1)"
    echo "$line"
    tps="$(sed -n 's/.*tok\/s=\([0-9,]*\).*/\1/p' <<<"$line" | tr -d ,)"
    [[ "$line" == *OOM* ]] && tps="OOM"
    mem="$(sed -n 's/.*mem=\([0-9.]*\)GiB.*/\1/p' <<<"$line")"
    echo "| PyTorch $pmode | $ckpt | $seq | ${tps:-failed} | - | ${mem:--} | - |" >>"$table"
  done
fi
cat "$table"
