#!/usr/bin/env bash
# FP8 against bf16 on real text (#32's loss-curve target), in one device call:
#
#   scripts/gpu/fp8_loss_curve.sh [CPFORMER] [OUT_DIR]
#   STEPS=2000 ROWS=16 CORPUS_MB=150 PRECISIONS="bf16 fp8:current fp8:delayed fp8:delayed:1" scripts/gpu/fp8_loss_curve.sh
#
# 1. Builds a corpus from the text files the machine has (CORPUS_ROOTS, default the Python packages of
#    the GPU machine's venv and /usr/share/doc): every *.py, *.md, *.rst and *.txt under 512 KiB, in
#    sorted path order, concatenated up to CORPUS_MB megabytes, so the corpus is the same on every run.
# 2. Tokenizes it with `cpformer tokenize` (GPT-2 BPE, blank-line documents, the first VAL_DOCUMENTS (2000)
#    held out).
# 3. Trains configs/gpu_gpt2_124m.yaml on it once per entry of PRECISIONS (precision[:recipe[:margin]]:
#    bf16, fp8:current, fp8:delayed, fp8:delayed:1) with the same seed, data order and schedule (cosine
#    from lr 6e-4, 100 warm-up steps). Delayed runs also report the casts that clipped (fp8_clipped).
#    REPEATS (default 1) runs of each: the GPU's attention backward is not deterministic, so identical
#    runs drift apart (1.3% in held-out loss between bf16 runs at 2,000 steps, docs/fp8.md).
# 4. Prints each run's last train loss, final held-out loss, its ratio to the mean of the bf16 runs (or
#    to BF16_EVAL_LOSS) and its clipped casts, then each precision's mean; copies every metrics.jsonl to
#    OUT_DIR/<name>.metrics.jsonl (draw them with `cpformer plot A.metrics.jsonl B.metrics.jsonl --out x.svg`).
#
# CPFORMER: default build/gpu-carry/bin/cpformer (`WITH_APPS=1 scripts/gpu/build.sh`); OUT_DIR: default
# $OUT, else out/fp8_loss_curve. BF16_EVAL_LOSS: the ratios' base when PRECISIONS has no bf16 run.
# CPF_SET="key=value ..." adds --set overrides to every run (a CPU smoke run of this script:
# CPF_SET="run.device=cpu model.num_layers=1 ..." with STEPS=20; tests/scripts/fp8_loss_curve_test.sh).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CPFORMER="${1:-$ROOT/build/gpu-carry/bin/cpformer}"
OUT_DIR="${2:-${OUT:-$ROOT/out/fp8_loss_curve}}"
STEPS="${STEPS:-2000}"
ROWS="${ROWS:-16}"
WARMUP="${WARMUP:-100}"
CORPUS_MB="${CORPUS_MB:-150}"
VAL_DOCUMENTS="${VAL_DOCUMENTS:-2000}"
PRECISIONS="${PRECISIONS-bf16 fp8:current fp8:delayed}"
REPEATS="${REPEATS:-1}"
CORPUS_ROOTS="${CORPUS_ROOTS:-/opt/torch/.venv/lib /usr/share/doc}"
WORK="${WORK:-/tmp/cpf_fp8_loss}"
CONFIG="${CONFIG:-$ROOT/configs/gpu_gpt2_124m.yaml}"
if ! [[ "$REPEATS" =~ ^[1-9][0-9]*$ ]]; then
  echo "fp8_loss_curve.sh: REPEATS=$REPEATS: expected a whole number >= 1 (runs of each precision)" >&2
  exit 2
fi
if [[ ! -x "$CPFORMER" ]]; then
  echo "fp8_loss_curve.sh: no cpformer binary at $CPFORMER (build it: WITH_APPS=1 scripts/gpu/build.sh)" >&2
  exit 1
fi
mkdir -p "$OUT_DIR" "$WORK"
if [[ -f "$ROOT/scripts/gpu/machine_env.sh" ]]; then
  source "$ROOT/scripts/gpu/machine_env.sh"
  cpf_gpu_env "$(dirname "$CPFORMER")/../lib"
fi

# 1. The corpus: sorted paths, so the same machine image gives the same bytes.
corpus="$WORK/corpus.txt"
if [[ ! -s "$corpus" ]]; then
  # shellcheck disable=SC2086
  find $CORPUS_ROOTS -xdev -type f \( -name '*.py' -o -name '*.md' -o -name '*.rst' -o -name '*.txt' \) \
    -size -512k 2>/dev/null | LC_ALL=C sort | tr '\n' '\0' | xargs -0 cat 2>/dev/null |
    head -c "$((CORPUS_MB * 1000000))" >"$corpus"
fi
echo "corpus: $(wc -c <"$corpus") bytes from $CORPUS_ROOTS"

# 2. Shards.
if ! ls "$WORK"/text_train_*.bin >/dev/null 2>&1; then
  "$CPFORMER" tokenize "$corpus" --output "$WORK/text" --val-documents "$VAL_DOCUMENTS" 2>&1 | tail -2 || exit 1
fi

# A field of the last line of a metrics file holding KEY ("" when absent).
last_field() { grep "\"$2\"" "$1" 2>/dev/null | tail -1 | sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p"; }

# One training run: train_once NAME PRECISION RECIPE MARGIN; its exit status.
train_once() {
  local name=$1 precision=$2 recipe=$3 margin=$4
  local args=(--set "run.precision=$precision")
  [[ -n "$recipe" ]] && args+=(--set "fp8.recipe=$recipe")
  [[ -n "$margin" ]] && args+=(--set "fp8.margin=$margin")
  echo "== $name: $STEPS steps of $ROWS rows"
  "$CPFORMER" train "$CONFIG" --set "run.out_dir=$WORK/runs/$name" --set "run.steps=$STEPS" --set run.log_every=25 \
    --set run.eval_every=250 --set run.eval_batches=16 --set run.checkpoint_every=0 --set run.seed=1234 \
    --set data.source=shards --set "data.path=$WORK/text_train_*.bin" --set "run.eval_path=$WORK/text_val_*.bin" \
    --set "data.batch_size=$ROWS" --set "schedule.warmup_steps=$WARMUP" "${args[@]}" "${extra[@]}" \
    >"$WORK/$name.log" 2>&1
  local rc=$?
  tail -2 "$WORK/$name.log"
  return $rc
}

# The mean of the numbers on stdin ("" when none).
mean() { awk '$1 != "" && $1 != "-" { s += $1; n++ } END { if (n) printf "%.6f", s / n }'; }
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && a != "-" && b != "") printf "%+.3f%%", (a / b - 1) * 100 }'
}

# 3. REPEATS runs per precision, same seed and data (they differ only where the GPU's kernels are not
#    deterministic), each row of the first table one run, each row of the second one precision's mean.
extra=()
for kv in ${CPF_SET:-}; do extra+=(--set "$kv"); done
rows=()  # "name spec exit train_loss eval_loss tokens/s clipped"
for spec in $PRECISIONS; do
  IFS=: read -r precision recipe margin <<<"$spec"
  for ((r = 1; r <= REPEATS; ++r)); do
    name="${spec//:/_}"
    ((REPEATS > 1)) && name="${name}_$r"
    train_once "$name" "$precision" "$recipe" "$margin"
    rc=$?
    metrics="$WORK/runs/$name/metrics.jsonl"
    cp "$metrics" "$OUT_DIR/$name.metrics.jsonl" 2>/dev/null
    clipped="$(grep -o '"fp8_clipped":[0-9]*' "$metrics" 2>/dev/null | awk -F: '{ n += $2 } END { if (NR) print n }')"
    train_loss="$(last_field "$metrics" loss)"
    eval_loss="$(last_field "$metrics" eval_loss)"
    tps="$(last_field "$metrics" tokens_per_s)"
    rows+=("$name $spec $rc ${train_loss:--} ${eval_loss:--} ${tps:--} ${clipped:--}")
  done
done

# 4. The tables, against the mean held-out loss of the bf16 runs (else BF16_EVAL_LOSS).
column() { printf '%s\n' "${rows[@]}" | awk -v spec="$1" -v k="$2" '$2 == spec { print $k }'; }
base_eval="$(column bf16 5 | mean)"
[[ -z "$base_eval" ]] && base_eval="${BF16_EVAL_LOSS:-}"
report="$OUT_DIR/fp8_loss_curve.md"
{
  echo "| run | steps | last train loss | held-out loss | vs bf16 (held-out) | tokens/s | fp8 casts clipped |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  for row in "${rows[@]}"; do
    read -r name spec rc train_loss eval_loss tps clipped <<<"$row"
    echo "| $name (exit $rc) | $STEPS | $train_loss | $eval_loss | $(ratio "$eval_loss" "$base_eval") | $tps | $clipped |"
  done
  echo
  echo "| precision | runs | mean held-out loss | vs bf16 |"
  echo "| --- | --- | --- | --- |"
  for spec in $PRECISIONS; do
    m="$(column "$spec" 5 | mean)"
    echo "| $spec | $REPEATS | $m | $(ratio "$m" "$base_eval") |"
  done
} >"$report"
echo
cat "$report"
