#!/usr/bin/env bash
# app_layers_test.sh refuses an include running up the floors and a folder apps/README.md does not list,
# naming the file (on a small repository written to a temporary folder).
#   tests/docs/app_layers_checker_test.sh <path to app_layers_test.sh>
set -euo pipefail
checker="${1:?usage: app_layers_checker_test.sh <app_layers_test.sh>}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/apps/low" "$tmp/apps/high"
printf '1. `apps/low/`: below\n2. `apps/high/`: above\n' >"$tmp/apps/README.md"
printf '#include "apps/low/a.h"\n' >"$tmp/apps/high/b.h"
printf '#pragma once\n' >"$tmp/apps/low/a.h"
out="$(bash "$checker" "$tmp")" || { echo "a downward include was refused: $out"; exit 1; }

printf '#include "apps/high/b.h"\n' >"$tmp/apps/low/c.cpp"
if out="$(bash "$checker" "$tmp")"; then echo "an upward include passed: $out"; exit 1; fi
grep -q 'apps/low/c.cpp (floor 1, apps/low/) includes apps/high/b.h of a higher floor (2, apps/high/)' <<<"$out" ||
  { echo "unexpected message: $out"; exit 1; }
rm "$tmp/apps/low/c.cpp"

mkdir -p "$tmp/apps/stray"
printf '#pragma once\n' >"$tmp/apps/stray/d.h"
if out="$(bash "$checker" "$tmp")"; then echo "an unlisted folder passed: $out"; exit 1; fi
grep -q 'apps/stray/d.h: its folder apps/stray/ is not listed in apps/README.md' <<<"$out" ||
  { echo "unexpected message: $out"; exit 1; }
echo "app_layers_checker_test: upward include and unlisted folder refused"
