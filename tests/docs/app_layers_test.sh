#!/usr/bin/env bash
# apps/README.md lists the program's folders as floors, bottom first; a file may include its own folder
# and the folders listed before it, never one listed after it, and every folder holding code is listed.
#   tests/docs/app_layers_test.sh <repository root>
set -euo pipefail
root="${1:?usage: app_layers_test.sh <repository root>}"
readme="$root/apps/README.md"
[[ -f "$readme" ]] || { echo "missing $readme"; exit 1; }
mapfile -t floors < <(grep -oE '^[0-9]+\. `apps/[a-z_/]+/`' "$readme" | sed -E 's/^[0-9]+\. `(apps\/[a-z_/]+)\/`$/\1/')
[[ ${#floors[@]} -gt 0 ]] || { echo "apps/README.md lists no floors ('1. \`apps/<folder>/\`: ...')"; exit 1; }
floor_of() {  # the floor index of a folder, or -1
  local i
  for i in "${!floors[@]}"; do [[ "${floors[$i]}" == "$1" ]] && { echo "$i"; return; }; done
  echo -1
}
fail=0
checked=0
while IFS= read -r file; do
  dir="$(dirname "$file")"
  own="$(floor_of "$dir")"
  [[ "$own" -ge 0 ]] || { echo "$file: its folder $dir/ is not listed in apps/README.md"; fail=1; continue; }
  while IFS= read -r inc; do
    [[ -n "$inc" ]] || continue
    target="$(floor_of "$(dirname "$inc")")"
    if [[ "$target" -lt 0 ]]; then
      echo "$file includes $inc, whose folder is not listed in apps/README.md"; fail=1
    elif [[ "$target" -gt "$own" ]]; then
      echo "$file (floor $((own + 1)), $dir/) includes $inc of a higher floor ($((target + 1)), $(dirname "$inc")/)"
      fail=1
    fi
    checked=$((checked + 1))
  done < <(grep -oE '^#include "apps/[a-z_/]+\.h"' "$root/$file" | sed -E 's/^#include "(.*)"$/\1/')
done < <(cd "$root" && find apps -mindepth 2 \( -name '*.h' -o -name '*.cpp' \) | sort)
[[ $fail -eq 0 ]] && echo "app_layers_test: ${#floors[@]} floors, $checked includes, none upward"
exit $fail
