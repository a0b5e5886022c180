#!/usr/bin/env bash
# scripts/gpu/fp8_speed.sh on the CPU with a three-block model for two steps: a row per run with its
# tokens/s and its ratios to the bf16 run and to the peer (a stand-in program that prints a peer's line),
# the recipes and the bf16 edge blocks reaching the runs, the peer's own row; a missing binary, an unknown
# shape or recipe and a bad STEPS refused with their messages.
#
#   fp8_speed_test.sh SCRIPT CPFORMER
set -uo pipefail
script="$1"
cpformer="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The peer is run as "$PYTHON PEER ARGS": bash stands in for Python (the repository has none).
cat >"$work/peer.sh" <<'PEER'
echo "torch llama L=3 seq=$1 compile=True ckpt=False params=1.6M step=50.0ms tok/s=1,000 mem=0.1GiB loss=9.0"
PEER
tiny="run.device=cpu model.num_layers=3 model.hidden_size=32 model.num_heads=4 model.num_kv_heads=2"
tiny+=" model.intermediate_size=64 data.seq_len=64"
out="$(PYTHON=bash PEER="$work/peer.sh" SHAPES=llama1b RECIPES="delayed current:edges" STEPS=2 CPF_SET="$tiny" \
  bash "$script" "$cpformer" "$work/out" 2>&1)" || fail "the script failed: $out"
echo "$out"
table="$work/out/fp8_speed.md"
[[ -f "$table" ]] || fail "no $table"
number='[0-9][0-9]*'
grep -q "^| llama1b | bf16 | $number | 1.00 | [0-9.]* | - | - | - |\$" "$table" || fail "bf16 row: $(cat "$table")"
for run in delayed current:edges; do
  grep -q "^| llama1b | $run | $number | [0-9.]* | [0-9.]* | - | - | - |\$" "$table" || fail "$run row: $(cat "$table")"
done
grep -q '^| llama1b | PyTorch peer (torch.compile, bf16) | 1000 | [0-9.]* | 1.00 | - | - | - |$' "$table" ||
  fail "peer row: $(cat "$table")"
# vs peer = tokens/s / 1000 (the shown tokens/s is rounded, the ratio taken before: within 0.01).
bf16_tps="$(sed -n 's/^| llama1b | bf16 | \([0-9]*\) .*/\1/p' "$table")"
bf16_vs_peer="$(sed -n 's/^| llama1b | bf16 | [0-9]* | 1.00 | \([0-9.]*\) .*/\1/p' "$table")"
awk -v t="$bf16_tps" -v r="$bf16_vs_peer" 'BEGIN { d = t / 1000 - r; exit !(r > 0 && d < 0.01 && d > -0.01) }' ||
  fail "bf16 / peer ratio $bf16_vs_peer for $bf16_tps tokens/s"
grep -q 'fp8 linears (delayed scaling' "$work/out/llama1b_delayed.log" || fail "delayed did not reach its run"
grep -q 'fp8 linears (current scaling; margin 0; bf16 blocks: first 1, last 1)' "$work/out/llama1b_current_edges.log" ||
  fail "current:edges did not reach its run: $(head -1 "$work/out/llama1b_current_edges.log")"
[[ -f "$work/out/llama1b_bf16.log" ]] && ! grep -q 'fp8 linears' "$work/out/llama1b_bf16.log" ||
  fail "the bf16 run's log is missing or names FP8 linears"
[[ ! -d "$work/out/runs/llama1b_bf16/checkpoints" ]] || fail "the checkpoints were kept"

expect_refusal() {  # expect_refusal MESSAGE ENV...
  local message="$1"
  shift
  local got
  got="$(env "$@" bash "$script" "$cpformer" "$work/refused" 2>&1)" && fail "accepted: $*"
  [[ "$got" == *"$message"* ]] || fail "for $*: expected '$message', got: $got"
}
got="$(bash "$script" "$work/none" "$work/refused" 2>&1)" && fail "a missing binary was accepted"
[[ "$got" == *"fp8_speed.sh: no cpformer binary at $work/none (build it: WITH_APPS=1 scripts/gpu/build.sh)"* ]] ||
  fail "missing binary: $got"
expect_refusal "fp8_speed.sh: unknown shape 'llama9b' (llama1b, llama3b8, gpt2)" SHAPES=llama9b
expect_refusal "fp8_speed.sh: unknown recipe 'delayed:ends' (delayed or current, :edges)" RECIPES=delayed:ends
expect_refusal "fp8_speed.sh: STEPS must be a whole number >= 2, got '1'" STEPS=1
echo "fp8_speed_test: passed"
