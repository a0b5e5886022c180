#!/usr/bin/env bash
# Checks that every C++ and CUDA source of the repository is formatted as .clang-format says (the
# Debian 12 clang-format, 14.x: another major version may format a few constructs differently).
#
#   scripts/check_format.sh [REPO_ROOT]        # exit 0: formatted; 1: files to format (listed); 2: no tool
#   scripts/check_format.sh --fix [REPO_ROOT]  # formats them in place
#
# Files: the tracked *.h, *.cpp, *.cu and *.cuh (git ls-files), or, outside a git checkout (a source
# archive), every such file under apps/ attention/ benchmarks/ examples/ framework/ models/ tests/.
set -uo pipefail

fix=0
if [[ "${1:-}" == "--fix" ]]; then fix=1; shift; fi
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$root" || { echo "check_format: no folder $root" >&2; exit 2; }
tool="${CLANG_FORMAT:-clang-format}"
if ! command -v "$tool" >/dev/null 2>&1; then
  echo "check_format: $tool not found (Debian package clang-format; scripts/install-deps.sh installs it)" >&2
  exit 2
fi
[[ -f .clang-format ]] || { echo "check_format: no .clang-format in $root" >&2; exit 2; }

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
else
  mapfile -t files < <(find apps attention benchmarks examples framework models tests -type f \
                         \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null | sort)
fi
[[ ${#files[@]} -gt 0 ]] || { echo "check_format: no source files under $root" >&2; exit 2; }

if [[ $fix == 1 ]]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$tool" -i --style=file
  exit $?
fi
unformatted=()
for f in "${files[@]}"; do
  "$tool" --style=file --dry-run --Werror "$f" >/dev/null 2>&1 || unformatted+=("$f")
done
if [[ ${#unformatted[@]} -gt 0 ]]; then
  echo "check_format: ${#unformatted[@]} of ${#files[@]} files are not formatted (scripts/check_format.sh --fix):"
  printf '  %s\n' "${unformatted[@]}"
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
