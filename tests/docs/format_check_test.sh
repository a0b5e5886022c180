#!/usr/bin/env bash
# scripts/check_format.sh on a small source folder it writes (outside git): a formatted file passes, an
# unformatted one is listed with exit 1, --fix formats it, and a folder without .clang-format or without
# sources is refused with exit 2 and its message. Usage: format_check_test.sh CHECKER REPO_ROOT
set -uo pipefail
checker="${1:?usage: format_check_test.sh CHECKER REPO_ROOT}"
repo="${2:?usage: format_check_test.sh CHECKER REPO_ROOT}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p "$dir/framework"
cp "$repo/.clang-format" "$dir/"
printf 'int add(int a, int b) { return a + b; }\n' >"$dir/framework/ok.cpp"
out="$(bash "$checker" "$dir" 2>&1)"; code=$?
[[ $code == 0 && "$out" == *"1 files formatted"* ]] || fail "formatted folder: exit $code: $out"

printf 'int   sub(int a,int b){return a-b;}\n' >"$dir/framework/bad.cpp"
out="$(bash "$checker" "$dir" 2>&1)"; code=$?
[[ $code == 1 && "$out" == *"1 of 2 files are not formatted"* && "$out" == *"framework/bad.cpp"* ]] ||
  fail "unformatted file: exit $code: $out"

bash "$checker" --fix "$dir" >/dev/null 2>&1 || fail "--fix failed"
out="$(bash "$checker" "$dir" 2>&1)"; code=$?
[[ $code == 0 ]] || fail "after --fix: exit $code: $out"

rm "$dir/.clang-format"
out="$(bash "$checker" "$dir" 2>&1)"; code=$?
[[ $code == 2 && "$out" == *"no .clang-format in"* ]] || fail "no .clang-format: exit $code: $out"

empty="$(mktemp -d)"; cp "$repo/.clang-format" "$empty/"
out="$(bash "$checker" "$empty" 2>&1)"; code=$?; rm -rf "$empty"
[[ $code == 2 && "$out" == *"no source files under"* ]] || fail "no sources: exit $code: $out"
echo "format_check_test: 5 cases passed"
