#!/usr/bin/env bash
# scripts/gpu/fp8_loss_curve.sh on the CPU with a one-block model for a few steps: the corpus is built
# from a folder of text, tokenized, trained REPEATS times per PRECISIONS entry (recipe and margin reach
# the runs), and the tables hold a row per run with its held-out loss, its ratio to the bf16 runs' mean
# and the clipped casts of the delayed runs, then each precision's mean; a missing binary and a bad
# REPEATS are refused with their messages.
#
#   fp8_loss_curve_test.sh SCRIPT CPFORMER
set -uo pipefail
script="$1"
cpformer="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p "$work/text"
for i in $(seq 1 60); do
  printf 'Paragraph %d says the quick brown fox jumps over the lazy dog, %d times.\n\n' "$i" "$((i * 7))"
done >"$work/text/a.txt"

out="$(REPEATS=2 VAL_DOCUMENTS=10 WARMUP=1 STEPS=4 ROWS=2 CORPUS_MB=1 CORPUS_ROOTS="$work/text" WORK="$work/run" \
  PRECISIONS="bf16 fp8:delayed:1" \
  CPF_SET="run.device=cpu model.num_layers=1 model.hidden_size=32 model.num_heads=2 data.seq_len=64 model.max_positions=64 run.eval_batches=1" \
  bash "$script" "$cpformer" "$work/out" 2>&1)" || fail "the script failed: $out"
echo "$out"
table="$work/out/fp8_loss_curve.md"
[[ -f "$table" ]] || fail "no $table"
for r in 1 2; do
  grep -q "^| bf16_$r (exit 0) | 4 | [0-9.]* | [0-9.]* | [-+][0-9.]*% | [0-9.]* | - |\$" "$table" ||
    fail "bf16 run $r row: $(cat "$table")"
  grep -q "^| fp8_delayed_1_$r (exit 0) | 4 | [0-9.]* | [0-9.]* | [-+][0-9.]*% | [0-9.]* | [0-9]* |\$" "$table" ||
    fail "fp8 delayed margin 1, run $r row: $(cat "$table")"
  [[ -f "$work/out/bf16_$r.metrics.jsonl" && -f "$work/out/fp8_delayed_1_$r.metrics.jsonl" ]] || fail "metrics not copied"
  grep -q '"fp8_clipped"' "$work/out/fp8_delayed_1_$r.metrics.jsonl" || fail "the delayed run logged no fp8_clipped"
done
grep -q '^| bf16 | 2 | [0-9.]* | +0.000% |$' "$table" || fail "bf16 mean row: $(cat "$table")"
grep -q '^| fp8:delayed:1 | 2 | [0-9.]* | [-+][0-9.]*% |$' "$table" || fail "fp8 mean row: $(cat "$table")"
grep -q 'fp8 linears (delayed scaling: amax history 16, max; margin 1)' "$work/run/fp8_delayed_1_1.log" ||
  fail "recipe or margin did not reach the run: $(head -5 "$work/run/fp8_delayed_1_1.log")"

missing="$(bash "$script" "$work/no_such_cpformer" "$work/out2" 2>&1)" && fail "a missing binary was accepted"
[[ "$missing" == *"no cpformer binary at $work/no_such_cpformer (build it: WITH_APPS=1 scripts/gpu/build.sh)"* ]] ||
  fail "missing-binary message: $missing"
bad="$(REPEATS=0 bash "$script" "$cpformer" "$work/out3" 2>&1)" && fail "REPEATS=0 was accepted"
[[ "$bad" == *"REPEATS=0: expected a whole number >= 1 (runs of each precision)"* ]] || fail "REPEATS message: $bad"
echo "PASS"
