#!/usr/bin/env bash
# FP8 against bf16 speed in one device call (#32's speed targets; docs/fp8.md, "Figures"):
#
#   scripts/gpu/fp8_speed.sh [CPFORMER] [OUT_DIR]
#   SHAPES="llama1b gpt2" RECIPES="delayed delayed:edges current" STEPS=8 scripts/gpu/fp8_speed.sh
#
# For each shape of SHAPES it trains cpformer once in bf16 and once per entry of RECIPES in FP8, then the
# PyTorch peer where the shape has one and PEER exists, and writes OUT_DIR/fp8_speed.md: tokens/s of the
# last logged window, the ratio to cpformer's bf16 run and to the peer, MFU against the bf16 and the FP8
# peak, and the peak memory.
#
#   llama1b   configs/llama3_1b_long.yaml, GPT-2 vocabulary (50304), 8192 tokens, no recomputation;
#             peer: `python3 PEER 8192 compile none` (peers/llama_torch.py: torch.compile bf16, kept outside
#             the repository and carried to the GPU machine)
#   llama3b8  the same with Llama-3.2-3B's blocks (hidden 3072, 24 query heads of 128), 8 of them
#   gpt2      configs/gpu_gpt2_124m.yaml, 32 rows of 1024 tokens; peer: `python3 GPT2_PEER 32 compile`
#
# RECIPES entries: delayed | current, with ":edges" for the first and last blocks kept in bf16.
# CPF_SET="key=value ..." adds --set overrides to every cpformer run, after the shape's (a CPU smoke run of
# this script: tests/scripts/fp8_speed_test.sh). CPFORMER: default build/gpu-carry/bin/cpformer.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CPFORMER="${1:-$ROOT/build/gpu-carry/bin/cpformer}"
OUT_DIR="${2:-${OUT:-$ROOT/out/fp8_speed}}"
SHAPES="${SHAPES:-llama1b llama3b8 gpt2}"
RECIPES="${RECIPES:-delayed delayed:edges}"
STEPS="${STEPS:-8}"
PEER="${PEER:-$ROOT/peers/llama_torch.py}"
GPT2_PEER="${GPT2_PEER:-$ROOT/peers/gpt2_torch.py}"
if [[ ! -x "$CPFORMER" ]]; then
  echo "fp8_speed.sh: no cpformer binary at $CPFORMER (build it: WITH_APPS=1 scripts/gpu/build.sh)" >&2
  exit 2
fi
if [[ ! "$STEPS" =~ ^[0-9]+$ || "$STEPS" -lt 2 ]]; then
  echo "fp8_speed.sh: STEPS must be a whole number >= 2, got '$STEPS'" >&2
  exit 2
fi
mkdir -p "$OUT_DIR"
source "$ROOT/scripts/gpu/machine_env.sh"
cpf_gpu_env "$(dirname "$CPFORMER")/../lib"

shape_args() {  # the shape's config and --set overrides, one per line
  case "$1" in
    llama1b | llama3b8)
      printf '%s\n' "$ROOT/configs/llama3_1b_long.yaml" --set model.vocab_size=50304 --set data.seq_len=8192 \
        --set model.recompute=none
      if [[ "$1" == llama3b8 ]]; then
        printf '%s\n' --set model.hidden_size=3072 --set model.num_heads=24 --set model.num_layers=8
      fi
      ;;
    gpt2) printf '%s\n' "$ROOT/configs/gpu_gpt2_124m.yaml" --set data.batch_size=32 ;;
    *) return 1 ;;
  esac
}
recipe_args() {  # bf16, or an entry of RECIPES
  [[ "$1" == bf16 ]] && return 0
  [[ "$1" =~ ^(delayed|current)(:edges)?$ ]] || return 1
  printf '%s\n' --set run.precision=fp8 --set "fp8.recipe=${1%%:*}"
  [[ "$1" == *:edges ]] && printf '%s\n' --set fp8.bf16_first_blocks=1 --set fp8.bf16_last_blocks=1
  return 0
}
for s in $SHAPES; do
  shape_args "$s" >/dev/null || { echo "fp8_speed.sh: unknown shape '$s' (llama1b, llama3b8, gpt2)" >&2; exit 2; }
done
for r in $RECIPES; do
  recipe_args "$r" >/dev/null || { echo "fp8_speed.sh: unknown recipe '$r' (delayed or current, :edges)" >&2; exit 2; }
done

metric() { grep '"lr"' "$1" 2>/dev/null | tail -1 | sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p"; }
ratio() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else printf "-" }'; }
pct() { awk -v m="${1:-0}" 'BEGIN { if (m > 0) printf "%.1f%%", 100 * m; else printf "-" }'; }
device="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)"
table="$OUT_DIR/fp8_speed.md"
{
  echo "# FP8 against bf16, one device call ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo
  echo "- device: ${device:-unknown}; $STEPS steps a run, the last logged window"
  echo
  echo "| shape | run | tokens/s | vs bf16 | vs peer | MFU (bf16 peak) | MFU (FP8 peak) | peak GiB |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$table"

extra=()
for kv in ${CPF_SET:-}; do extra+=(--set "$kv"); done
for shape in $SHAPES; do
  mapfile -t args < <(shape_args "$shape")
  peer_tps=""  # the peer runs first so every row of the shape can name its ratio
  peer_cmd=()
  [[ "$shape" == llama1b && -f "$PEER" ]] && peer_cmd=("$PEER" 8192 compile none)
  [[ "$shape" == gpt2 && -f "$GPT2_PEER" ]] && peer_cmd=("$GPT2_PEER" 32 compile)
  if [[ ${#peer_cmd[@]} -gt 0 ]]; then
    echo "== $shape: peer"
    "$PYTHON" "${peer_cmd[@]}" >"$OUT_DIR/${shape}_peer.log" 2>&1
    peer_tps="$(sed -n 's/.*tok\/s=\([0-9,]*\).*/\1/p' "$OUT_DIR/${shape}_peer.log" | tail -1 | tr -d ,)"
  fi
  bf16_tps=""
  for run in bf16 $RECIPES; do
    mapfile -t recipe < <(recipe_args "$run")
    name="${shape}_${run//:/_}"
    dir="$OUT_DIR/runs/$name"
    rm -rf "$dir"
    echo "== $shape: $run"
    "$CPFORMER" train "${args[@]}" "${recipe[@]}" --set "run.out_dir=$dir" --set "run.steps=$STEPS" \
      --set "run.log_every=$((STEPS / 2))" --set schedule.warmup_steps=1 "${extra[@]}" \
      >"$OUT_DIR/$name.log" 2>&1
    rc=$?
    tps="$(metric "$dir/metrics.jsonl" tokens_per_s)"
    [[ "$run" == bf16 ]] && bf16_tps="$tps"
    peak="$(metric "$dir/metrics.jsonl" peak_memory_bytes)"
    peak="$(awk -v b="${peak:-0}" 'BEGIN { if (b > 0) printf "%.1f", b / 2^30; else printf "-" }')"
    mfu="$(pct "$(metric "$dir/metrics.jsonl" mfu)")" mfu8="-"
    [[ "$run" != bf16 ]] && mfu8="$(pct "$(metric "$dir/metrics.jsonl" mfu_fp8)")"
    shown="$(awk -v t="${tps:-0}" 'BEGIN { if (t > 0) printf "%.0f", t; else printf "-" }')"
    [[ $rc != 0 ]] && shown+=" (exit $rc)"
    vs="$(ratio "$tps" "$bf16_tps") | $(ratio "$tps" "$peer_tps")"
    echo "| $shape | $run | $shown | $vs | $mfu | $mfu8 | $peak |" >>"$table"
    rm -rf "$dir/checkpoints"  # 13 GB for the 1B shape
  done
  if [[ -n "$peer_tps" ]]; then
    row="| $shape | PyTorch peer (torch.compile, bf16) | $peer_tps | $(ratio "$peer_tps" "$bf16_tps") | 1.00"
    echo "$row | - | - | - |" >>"$table"
  fi
done
cat "$table"
