#!/usr/bin/env bash
# Namespaces follow folders: docs/architecture.md, "Namespaces", has a table of every source folder and
# its namespace; each `namespace cpf...` a file under that folder opens must be the folder's namespace or
# one nested in it (the root namespace `cpf` itself nests nothing: a folder in `cpf` lists the others it
# opens), unless the table's exception column names the file (with the namespace it opens).
#   tests/docs/namespaces_test.sh <repository root>
set -euo pipefail
root="${1:?usage: namespaces_test.sh <repository root>}"
section="$(awk '/^## Namespaces/{f=1; next} /^## /{f=0} f' "$root/docs/architecture.md")"
[[ -n "$section" ]] || { echo "docs/architecture.md has no section '## Namespaces'"; exit 1; }
# Rows: | `folder/` | `cpf::ns` | exceptions (`file`: `cpf::other`, ...) |
declare -A expected exceptions
while IFS='|' read -r _ folder ns rest; do
  folder="$(grep -oE '`[a-z_/]+/`' <<<"$folder" | tr -d '`' | sed 's#/$##')" || continue
  ns="$(grep -oE '`cpf(::[a-z_]+)*`' <<<"$ns" | tr -d '`' | tr '\n' ' ')" || continue
  [[ -n "$folder" && -n "$ns" ]] || continue
  expected["$folder"]="$ns"
  exceptions["$folder"]="$rest"
done <<<"$section"
[[ ${#expected[@]} -gt 0 ]] || { echo "docs/architecture.md, Namespaces: no '| \`folder/\` | \`cpf::...\` |' rows"; exit 1; }
fail=0
files=0
while IFS= read -r dir; do
  [[ -n "$(find "$root/$dir" -maxdepth 1 -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \))" ]] ||
    continue
  want="${expected[$dir]:-}"
  [[ -n "$want" ]] || { echo "docs/architecture.md, Namespaces: the folder $dir/ is not in the table"; fail=1; continue; }
  for file in "$root/$dir"/*.{h,cpp,cu,cuh}; do
    [[ -f "$file" ]] || continue
    rel="${file#"$root/"}"
    files=$((files + 1))
    while IFS= read -r opened; do
      ok=0
      for w in $want; do
        [[ "$opened" == "$w" || ("$w" != cpf && "$opened" == "$w::"*) ]] && ok=1
      done
      [[ $ok -eq 1 ]] && continue
      [[ "${exceptions[$dir]}" == *"\`$(basename "$rel")\`: \`$opened\`"* ]] && continue
      echo "$rel opens namespace $opened; its folder $dir/ is ${want% } (docs/architecture.md, Namespaces)"
      fail=1
    done < <(grep -oE '^namespace cpf(::[a-z_]+)* \{' "$file" | sed -E 's/^namespace (.*) \{$/\1/')
  done
done < <(cd "$root" && find framework attention models apps -type d | sort)
[[ $fail -eq 0 ]] && echo "namespaces_test: ${#expected[@]} folders, $files files, every namespace follows its folder"
exit $fail
