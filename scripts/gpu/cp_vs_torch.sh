#!/usr/bin/env bash
# Context-parallel attention of cpformer against PyTorch's context_parallel on the same N GPUs, in one
# device call:
#
#   scripts/gpu/cp_vs_torch.sh [GPU_CP_BENCH] [OUT_DIR]
#   N=4 TOKENS=16384,65536 STRATEGIES=p2p,all_gather,a2a,a2a:1 PEER=peers/torch_cp_bench.py scripts/gpu/cp_vs_torch.sh
#
# Runs gpu_cp_bench (fwd+bwd, causal, bf16, b=1 h=16 d=128; benchmarks/gpu/cp_bench.cpp) on N GPUs, then
# the PyTorch peer program as `torchrun --nproc-per-node N PEER` (the venv's torchrun, else
# `$PYTHON -m torch.distributed.run`). The peer is a measuring tool kept outside the repository, carried
# to the GPU machine in an ignored folder (default peers/torch_cp_bench.py); without it only
# cpformer's figures are printed. Prints and writes OUT_DIR/cp_vs_torch.md: per tokens/GPU, each
# cpformer strategy's ms against the fastest PyTorch method's ms at that size, and the speed ratio
# (PyTorch ms / cpformer ms: above 1 = cpformer faster), then every PyTorch row.
#
# What the parser expects (lines from either program that do not match are ignored, so banners,
# warnings and NCCL output do no harm):
#   cpformer  "<n> GPUs, <T> tokens per GPU, <strategy>: <ms> ms per call"       (gpu_cp_bench)
#             "1 GPU, <S> tokens: <ms> ms, ..."                                   (its one-GPU reference)
#   PyTorch   one line per measured (method, size), printed by rank 0, containing "tokens/GPU=<T>" (or
#             "tokens/GPU: <T>") and a time in ms: "tcp=<ms>ms" when present, else the last "<number>ms"
#             or "ms=<number>" on the line. The method is the text before "tokens/GPU" without a
#             leading "torch-cp", e.g. "torch-cp cudnn rotate=alltoall tokens/GPU=16384 n=2: t1=... tcp=81.2ms"
#             is method "cudnn rotate=alltoall". Lines with FAILED are listed as failures.
#
# GPU_CP_BENCH: default build/gpu-carry/bin/gpu_cp_bench (scripts/gpu/build.sh); OUT_DIR: default $OUT,
# else out/cp_vs_torch. N: default every visible GPU. THD_TOKENS=65536 adds gpu_cp_bench's
# packed-documents table to the log (default 0: off, the peer has no such case).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BENCH="${1:-$ROOT/build/gpu-carry/bin/gpu_cp_bench}"
OUT_DIR="${2:-${OUT:-$ROOT/out/cp_vs_torch}}"
N="${N:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)}"
TOKENS="${TOKENS:-16384,65536}"
STRATEGIES="${STRATEGIES:-p2p,all_gather,a2a,a2a:1,a2a+p2p}"
THD_TOKENS="${THD_TOKENS:-0}"
PEER="${PEER:-$ROOT/peers/torch_cp_bench.py}"
if [[ ! -x "$BENCH" ]]; then
  echo "cp_vs_torch.sh: no gpu_cp_bench binary at $BENCH (build it: scripts/gpu/build.sh)" >&2
  exit 1
fi
if [[ "$N" -lt 2 ]]; then
  echo "cp_vs_torch.sh: needs 2 or more GPUs, N=$N" >&2
  exit 1
fi
mkdir -p "$OUT_DIR"

source "$ROOT/scripts/gpu/machine_env.sh"
cpf_gpu_env "$(dirname "$BENCH")/../lib"
TORCHRUN="$(dirname "$PYTHON")/torchrun"

device="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
table="$OUT_DIR/cp_vs_torch.md"
cpf_log="$OUT_DIR/gpu_cp_bench.log"
peer_log="$OUT_DIR/peer.log"

echo "== cpformer: $BENCH --ranks $N --tokens $TOKENS --strategies $STRATEGIES --thd-tokens $THD_TOKENS"
"$BENCH" --ranks "$N" --tokens "$TOKENS" --strategies "$STRATEGIES" --thd-tokens "$THD_TOKENS" >"$cpf_log" 2>&1
cpf_exit=$?
grep -E "GPUs?, " "$cpf_log"

peer_exit=""
if [[ -f "$PEER" ]]; then
  if [[ -x "$TORCHRUN" ]]; then
    launcher=("$TORCHRUN")
  else
    launcher=("$PYTHON" -m torch.distributed.run)
  fi
  echo "== peer: ${launcher[*]} --nproc-per-node $N $PEER"
  "${launcher[@]}" --nproc-per-node "$N" "$PEER" >"$peer_log" 2>&1
  peer_exit=$?
  grep "tokens/GPU" "$peer_log"
else
  echo "== peer: $PEER not found; cpformer only"
  : >"$peer_log"
fi

# cpformer rows: "tokens<TAB>strategy<TAB>ms".
cpf_rows() {
  sed -n 's/^[0-9]* GPUs, \([0-9]*\) tokens per GPU, \(.*\): \([0-9.]*\) ms per call.*/\1\t\2\t\3/p' "$cpf_log"
}
# PyTorch rows: "tokens<TAB>method<TAB>ms" (ms "FAILED" for failures).
peer_rows() {
  awk '
    match($0, /tokens\/GPU[=:] *[0-9]+/) {
      t = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", t)
      method = substr($0, 1, RSTART - 1); sub(/^.*torch-cp */, "", method); gsub(/^ +| +$/, "", method)
      if (method == "") method = "torch"
      ms = ""
      if ($0 ~ /FAILED/) ms = "FAILED"
      else if (match($0, /tcp=[0-9.]+ *ms/)) { ms = substr($0, RSTART + 4, RLENGTH - 4); gsub(/[^0-9.]/, "", ms) }
      else if (match($0, /ms=[0-9.]+/)) { ms = substr($0, RSTART + 3, RLENGTH - 3) }
      else {
        line = $0
        while (match(line, /[0-9.]+ *ms/)) { ms = substr(line, RSTART, RLENGTH); line = substr(line, RSTART + RLENGTH) }
        gsub(/[^0-9.]/, "", ms)
      }
      if (ms != "") printf "%s\t%s\t%s\n", t, method, ms
    }' "$peer_log"
}

{
  echo "# Context-parallel attention: cpformer vs PyTorch context_parallel, $N GPUs ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo
  echo "- device: ${device:-unknown} x $N"
  echo "- cpformer: \`$(basename "$BENCH") --ranks $N --tokens $TOKENS --strategies $STRATEGIES\` (exit $cpf_exit): fwd+bwd, causal, bf16, b=1 h=16 d=128"
  if [[ -f "$PEER" ]]; then
    echo "- PyTorch: \`torchrun --nproc-per-node $N $(basename "$PEER")\` (exit $peer_exit)"
  else
    echo "- PyTorch: peer program not found ($PEER)"
  fi
  grep "^1 GPU" "$cpf_log" | sed 's/^/- cpformer one-GPU reference: /'
  echo
  echo "| tokens/GPU | cpformer strategy | cpformer ms | fastest PyTorch method | PyTorch ms | speed (PyTorch ms / cpformer ms) |"
  echo "| --- | --- | --- | --- | --- | --- |"
  peer_rows >"$OUT_DIR/.peer_rows"
  cpf_rows | while IFS=$'\t' read -r t name ms; do
    best="$(awk -F'\t' -v t="$t" '$1 == t && $3 != "FAILED" { if (b == "" || $3 + 0 < b + 0) { b = $3; m = $2 } }
                                   END { if (b != "") printf "%s\t%s", m, b }' "$OUT_DIR/.peer_rows")"
    method="${best%%$'\t'*}" torch_ms="${best##*$'\t'}"
    if [[ -z "$best" ]]; then method="-" torch_ms="-"; fi
    ratio="$(awk -v a="$torch_ms" -v b="$ms" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2fx", a / b; else print "-" }')"
    echo "| $t | $name | $ms | $method | $torch_ms | $ratio |"
  done
  if [[ -s "$OUT_DIR/.peer_rows" ]]; then
    echo
    echo "PyTorch rows:"
    echo
    echo "| tokens/GPU | method | ms |"
    echo "| --- | --- | --- |"
    awk -F'\t' '{ printf "| %s | %s | %s |\n", $1, $2, $3 }' "$OUT_DIR/.peer_rows"
  fi
  rm -f "$OUT_DIR/.peer_rows"
  if grep -q "^CP packed documents" "$cpf_log"; then
    echo
    echo "cpformer packed documents (no PyTorch counterpart):"
    echo
    echo '```'
    sed -n '/^CP packed documents/,$p' "$cpf_log"
    echo '```'
  fi
} >"$table"
cat "$table"
[[ "$cpf_exit" == 0 ]]
