#!/usr/bin/env bash
# scripts/check_doc_references.sh refuses what resolves to nothing: builds a small repository (not a
# git checkout, so every file counts) whose README.md and docs/ hold one reference of every kind that
# is stale and one that is fine, and checks the exit code and each message.
#   tests/docs/doc_references_test.sh <path of check_doc_references.sh>
set -euo pipefail
checker="${1:?usage: doc_references_test.sh <check_doc_references.sh>}"
fixture="$(mktemp -d)"
trap 'rm -rf "$fixture"' EXIT
mkdir -p "$fixture/docs" "$fixture/src/a"
touch "$fixture/src/a/x.cpp" "$fixture/src/a/x.h"
cat >"$fixture/README.md" <<'MD'
# Title

## Some Section: here

Fine: `src/a/x.{h,cpp}`, `x.cpp`, `a/x.h`, `src/a/`, [t](docs/b.md#some-section-here), `build/<preset>/x`,
the profile scope `src/check_inputs`.
Stale: `src/a/y.cpp`, [u](docs/b.md#nope), `cp_spec.md`, notes/GPU.md, `src/b/`.
```
src/a/z.cu
```
MD
cat >"$fixture/docs/b.md" <<'MD'
# B
## Some Section: here
[back](../README.md#title) [bad](../nope.md) [self](#b)
MD

status=0
output="$("$checker" "$fixture")" || status=$?
expected='README.md:7: link to docs/b.md#nope: docs/b.md has no heading with the anchor #nope
README.md:7: src/a/y.cpp is not in the repository
README.md:7: no file named cp_spec.md in the repository
README.md:7: no file named notes/GPU.md in the repository
README.md:7: src/b/ is not in the repository
README.md:9: src/a/z.cu is not in the repository
docs/b.md:3: link to ../nope.md: nope.md is not in the repository'
fail=0
[[ $status -eq 1 ]] || { echo "expected exit code 1, got $status"; fail=1; }
[[ "$output" == "$expected" ]] || { printf 'expected:\n%s\ngot:\n%s\n' "$expected" "$output"; fail=1; }

# Once the stale references are gone, it passes quietly.
sed -i '/^Stale:/d; /z\.cu/d' "$fixture/README.md"
sed -i 's/ \[bad\](..\/nope.md)//' "$fixture/docs/b.md"
status=0
output="$("$checker" "$fixture")" || status=$?
[[ $status -eq 0 && -z "$output" ]] || { printf 'expected a clean pass, got %d:\n%s\n' "$status" "$output"; fail=1; }

# A folder that is not a repository's root is refused with the fix.
status=0
output="$("$checker" "$fixture/src" 2>&1)" || status=$?
[[ $status -eq 2 && "$output" == *"has no README.md and docs/: pass the repository's root"* ]] ||
  { printf 'expected the root refusal (exit 2), got %d:\n%s\n' "$status" "$output"; fail=1; }
[[ $fail -eq 0 ]] && echo "doc_references_test: passed"
exit "$fail"
