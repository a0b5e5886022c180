#!/usr/bin/env bash
# scripts/check_function_length.sh finds what is too long and refuses what it cannot read: writes a small
# source folder (one function of 81 lines, one of 80, a lambda and a class that are no functions of their
# own) and checks the exit code and each message.
#   tests/docs/function_length_test.sh <path of check_function_length.sh>
set -euo pipefail
checker="${1:?usage: function_length_test.sh <check_function_length.sh>}"
fixture="$(mktemp -d)"
trap 'rm -rf "$fixture"' EXIT
mkdir -p "$fixture/src"
# A function whose body holds `body` statement lines: body + 2 lines from signature to closing brace.
function_of() {
  printf 'int %s(int x) {\n' "$1"
  for ((i = 0; i < $2; ++i)); do printf '  x += %d;  // a { in a comment\n' "$i"; done
  printf '}\n'
}
{
  function_of long_one 79  # 81 lines
  function_of fine_one 78  # 80 lines
  printf 'struct S {\n  int f() const { return 1; }\n};\n'
  printf 'const auto g = [](int x) { return x; };\n'
} >"$fixture/src/a.cpp"

fail=0
status=0
output="$("$checker" "$fixture/src" | sed 's/[ \t]*$//')" || status=$?  # names keep the space before `{`
expected="functions over 80 lines: 1
   81  $fixture/src/a.cpp:1  int long_one(int x)"
[[ $status -eq 1 ]] || { echo "expected exit code 1, got $status"; fail=1; }
[[ "$output" == "$expected" ]] || { printf 'expected:\n%s\ngot:\n%s\n' "$expected" "$output"; fail=1; }

# At a limit of 81 it passes quietly.
status=0
output="$("$checker" --max 81 "$fixture/src")" || status=$?
[[ $status -eq 0 && -z "$output" ]] || { printf 'expected a clean pass, got %d:\n%s\n' "$status" "$output"; fail=1; }

# Refusals, each with its message and exit code 2.
expect_refusal() {  # expect_refusal <message part> <checker args...>
  local want="$1" got st=0
  shift
  got="$("$checker" "$@" 2>&1)" || st=$?
  [[ $st -eq 2 && "$got" == *"$want"* ]] || { printf 'expected exit 2 with "%s", got %d:\n%s\n' "$want" "$st" "$got"; fail=1; }
}
expect_refusal "--max takes a whole number, got 'ten'" --max ten "$fixture/src"
expect_refusal "unknown option '--long'" --long "$fixture/src"
expect_refusal "no such file or folder: $fixture/nope" "$fixture/nope"
mkdir "$fixture/empty"
expect_refusal "no C++ or CUDA files under $fixture/empty" "$fixture/empty"
printf 'int open(int x) {\n  return x;\n' >"$fixture/src/b.cpp"
expect_refusal "$fixture/src/b.cpp: unbalanced braces, comments or raw strings at the end" "$fixture/src"
[[ $fail -eq 0 ]] && echo "function_length_test: passed"
exit "$fail"
