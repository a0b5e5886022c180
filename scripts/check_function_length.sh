#!/usr/bin/env bash
# Lists the C++/CUDA functions longer than a limit (docs/contributing.md: functions under 80 lines),
# from the line their signature starts on to their closing brace, longest first; exits 1 when any is
# found, so CI can run it. Tests are left out: a test body is a list of cases, not a function to split.
#
#   scripts/check_function_length.sh [--max N] [--all] [PATH...]
#     --max N  the longest a function may be (default 80)
#     --all    also print the count and the longest function when none is over the limit
#     PATH     files or folders to read (default: the library, app, model, benchmark and example
#              folders of the repository this script is in)
#
# It reads the text, not the AST: comments, strings, character and raw string literals and
# preprocessor lines are skipped; a brace opens a function when the text before it (since the last
# `;`, `{` or `}`) ends in a parameter list and qualifiers, outside any other function. Lambdas and
# local classes count toward the function that holds them.
set -euo pipefail

max=80
all=0
paths=()
while (($#)); do
  case "$1" in
    --max)
      [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || { echo "check_function_length: --max takes a whole number, got '${2-}'" >&2; exit 2; }
      max="$2"; shift 2 ;;
    --all) all=1; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check_function_length: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) paths+=("$1"); shift ;;
  esac
done
if ((${#paths[@]} == 0)); then
  cd "$(dirname "$0")/.."  # names relative to the repository
  for d in framework attention models apps benchmarks examples; do
    [[ -d "$d" ]] && paths+=("$d")
  done
fi
for p in "${paths[@]}"; do
  [[ -e "$p" ]] || { echo "check_function_length: no such file or folder: $p" >&2; exit 2; }
done

mapfile -d '' files < <(find "${paths[@]}" -type f \( -name '*.cpp' -o -name '*.cc' -o -name '*.cu' \
  -o -name '*.h' -o -name '*.hpp' -o -name '*.cuh' \) -not -path '*/tests/*' -print0 | sort -z)
((${#files[@]})) || { echo "check_function_length: no C++ or CUDA files under ${paths[*]}" >&2; exit 2; }

report="$(awk -v max="$max" '
function reset_header() { header = ""; header_line = 0 }
function add_header(c) {
  if (header_line == 0 && c !~ /[ \t]/) header_line = FNR
  header = header c
}
# The text before "{" ends in a parameter list and only qualifiers / a trailing return type.
function opens_function(h,    tail, i, depth, last, c, pre) {
  if (h ~ /^[ \t]*(template[ \t]*<.*>)?[ \t]*(class|struct|union|enum|namespace|extern)[ \t"]/) return 0
  if (h ~ /^[ \t]*(template[ \t]*<.*>)?[ \t]*(class|struct|union|enum|namespace)[ \t]*$/) return 0
  last = 0; depth = 0
  for (i = 1; i <= length(h); i++) {
    c = substr(h, i, 1)
    if (c == "(") depth++
    else if (c == ")") { depth--; if (depth == 0) last = i }
  }
  if (last == 0) return 0
  # A "=" before the parameter list is an initializer (a lambda or a braced value), unless operator=.
  pre = substr(h, 1, index(h, "(") - 1)
  if (pre ~ /=/ && pre !~ /operator/) return 0
  tail = substr(h, last + 1)
  gsub(/noexcept[ \t]*\([^)]*\)/, "", tail)
  gsub(/->[ \t]*[A-Za-z_:<>,*& \t0-9]+/, "", tail)
  gsub(/(const|noexcept|override|final|mutable|volatile|&&|&|[ \t])/, "", tail)
  # A constructor initializer list ends in ")" too; what is left after it is empty.
  return tail == ""
}
function check_balanced() {
  if (prev_file != "" && (depth != 0 || fdepth >= 0 || in_comment || raw_end != ""))
    printf "warn\t%s\tunbalanced braces, comments or raw strings at the end: not read reliably\n", prev_file
}
FNR == 1 {
  check_balanced(); prev_file = FILENAME
  depth = 0; fdepth = -1; in_comment = 0; raw_end = ""; reset_header(); continuation = 0
}
{
  line = $0
  if (raw_end != "") {
    k = index(line, raw_end)
    if (k == 0) next
    line = substr(line, k + length(raw_end))
    raw_end = ""
  }
  if (!in_comment && (continuation || line ~ /^[ \t]*#/)) {
    continuation = (line ~ /\\[ \t]*$/)
    next
  }
  n = length(line)
  for (i = 1; i <= n; i++) {
    c = substr(line, i, 1)
    if (in_comment) {
      if (c == "*" && substr(line, i + 1, 1) == "/") { in_comment = 0; i++ }
      continue
    }
    two = substr(line, i, 2)
    if (two == "//") break
    if (two == "/*") { in_comment = 1; i++; continue }
    if (c == "\"") {
      prev = (i > 1) ? substr(line, i - 1, 1) : ""
      if (prev == "R") {  # raw string: R"delim( ... )delim"
        p = index(substr(line, i + 1), "(")
        delim = substr(line, i + 1, p - 1)
        rest = substr(line, i + p + 1)
        k = index(rest, ")" delim "\"")
        if (k == 0) { raw_end = ")" delim "\""; break }
        i = i + p + k + length(delim) + 1
        if (fdepth < 0) add_header("s")
        continue
      }
      for (i++; i <= n; i++) {
        c = substr(line, i, 1)
        if (c == "\\") { i++; continue }
        if (c == "\"") break
      }
      if (fdepth < 0) add_header("s")
      continue
    }
    if (c == "\x27") {
      prev = (i > 1) ? substr(line, i - 1, 1) : ""
      if (prev ~ /[0-9A-Fa-f]/) continue  # a digit separator (1'\''000)
      for (i++; i <= n; i++) {
        c = substr(line, i, 1)
        if (c == "\\") { i++; continue }
        if (c == "\x27") break
      }
      continue
    }
    if (c == "{") {
      if (fdepth < 0 && opens_function(header)) {
        fdepth = depth; fstart = (header_line ? header_line : FNR)
        fname = header
        gsub(/[ \t]+/, " ", fname); sub(/^ /, "", fname)
        if (length(fname) > 100) fname = substr(fname, 1, 97) "..."
      }
      depth++
      reset_header()
      continue
    }
    if (c == "}") {
      depth--
      if (fdepth >= 0 && depth == fdepth) {
        len = FNR - fstart + 1
        printf "%d\t%s:%d\t%s\n", len, FILENAME, fstart, fname
        fdepth = -1
      }
      reset_header()
      continue
    }
    if (c == ";") { if (fdepth < 0) reset_header(); continue }
    if (fdepth < 0) add_header(c)
  }
  if (fdepth < 0) add_header(" ")
}
END { check_balanced() }
' "${files[@]}" | sort -t$'\t' -k1,1nr)"

warnings="$(grep "^warn" <<<"$report" || true)"
if [[ -n "$warnings" ]]; then
  awk -F"\t" '{ printf "check_function_length: %s: %s\n", $2, $3 }' <<<"$warnings" >&2
  exit 2
fi
over="$(awk -F'\t' -v max="$max" '$1 > max' <<<"$report")"
count=0
[[ -n "$over" ]] && count="$(wc -l <<<"$over")"
if ((count > 0)); then
  echo "functions over $max lines: $count"
  awk -F'\t' '{ printf "%5d  %s  %s\n", $1, $2, $3 }' <<<"$over"
  exit 1
fi
if ((all)); then
  total="$(grep -c . <<<"$report" || true)"
  longest="$(head -n1 <<<"$report" | awk -F'\t' '{ printf "%d lines: %s  %s", $1, $2, $3 }')"
  echo "functions over $max lines: 0 (of $total functions; the longest, $longest)"
fi
exit 0
