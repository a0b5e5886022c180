#!/usr/bin/env bash
# namespaces_test.sh refuses a file opening another folder's namespace, a folder missing from the table,
# and accepts a listed exception (on a small repository written to a temporary folder).
#   tests/docs/namespaces_checker_test.sh <path to namespaces_test.sh>
set -euo pipefail
checker="${1:?usage: namespaces_checker_test.sh <namespaces_test.sh>}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/docs" "$tmp/framework/io" "$tmp/attention" "$tmp/models" "$tmp/apps"
cat >"$tmp/docs/architecture.md" <<'MD'
## Namespaces

| folder | namespace | files that also open another |
| --- | --- | --- |
| `framework/io/` | `cpf::io` | `module_io.cpp`: `cpf::nn` |
MD
printf 'namespace cpf::io {\n}\nnamespace cpf::io::detail {\n}\n' >"$tmp/framework/io/a.h"
printf 'namespace cpf::nn {\n}\n' >"$tmp/framework/io/module_io.cpp"
out="$(bash "$checker" "$tmp")" || { echo "a folder following the table was refused: $out"; exit 1; }

printf 'namespace cpf::optim {\n}\n' >"$tmp/framework/io/b.cpp"
if out="$(bash "$checker" "$tmp")"; then echo "a foreign namespace passed: $out"; exit 1; fi
grep -q 'framework/io/b.cpp opens namespace cpf::optim; its folder framework/io/ is cpf::io' <<<"$out" ||
  { echo "unexpected message: $out"; exit 1; }
rm "$tmp/framework/io/b.cpp"

mkdir -p "$tmp/models/data"
printf 'namespace cpf::models::data {\n}\n' >"$tmp/models/data/c.h"
if out="$(bash "$checker" "$tmp")"; then echo "a folder missing from the table passed: $out"; exit 1; fi
grep -q 'the folder models/data/ is not in the table' <<<"$out" || { echo "unexpected message: $out"; exit 1; }
echo "namespaces_checker_test: foreign namespace and unlisted folder refused, listed exception accepted"
