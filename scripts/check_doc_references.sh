#!/usr/bin/env bash
# Checks that what README.md and docs/*.md point at is in the repository: markdown links (relative
# paths and their #section anchors), files and folders under the repository's top-level folders
# (`attention/cp/p2p.cpp`, `docs/cp.md`, `attention/cuda/cudnn_*.{h,cpp}`, `apps/trainer/`), and other
# source or doc file names, bare or with folders (`add_norm.cu`, `cp/lse_merge.cpp`, `cp_spec.md`,
# `notes/GPU.md`), in prose and in code blocks alike. Prints one line per reference that resolves to
# nothing and exits 1 when there is one, so CI can run it (tests/docs/CMakeLists.txt does).
#
#   scripts/check_doc_references.sh [REPO]     (default: the repository this script is in)
#
# The files are git's tracked files when REPO is a git checkout, else every file below REPO. Not
# checked: paths with a placeholder (`build/<preset>`), under build/ or absolute (/usr), and slashed
# words without an extension or a trailing "/" (profile scopes such as `attention/check_inputs`). A
# name that is not under a top-level folder resolves when some file's path ends in it. The few files
# that are not in the repository on purpose (generated files, a user's data) are listed in not_in_repo.
set -euo pipefail

case "${1-}" in
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
repo="${1:-$(dirname "$0")/..}"
[[ -d "$repo" ]] || { echo "check_doc_references: no such folder: $repo" >&2; exit 2; }
cd "$repo"
[[ -f README.md && -d docs ]] || { echo "check_doc_references: $PWD has no README.md and docs/: pass the repository's root" >&2; exit 2; }

files="$(mktemp)"
trap 'rm -f "$files"' EXIT
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files --cached --others --exclude-standard >"$files"
else
  # Build trees and script outputs are not the repository's (git ignores them).
  find . \( -path ./.git -o -path ./build -o -path ./out \) -prune -o -type f -print | sed 's|^\./||' >"$files"
fi
# Top-level folders that hold tracked files: a path starting with one of them must resolve.
tops="$(grep '/' "$files" | cut -d/ -f1 | sort -u | paste -sd'|')"

# One line per reference: doc, line, kind (link | path | name), reference.
refs() {
  awk -v tops="$tops" '
    FNR == 1 { fence = 0 }
    /^[ \t]*(```|~~~)/ { fence = !fence; scan_paths($0); next }
    {
      if (!fence) scan_links($0)
      scan_paths($0)
    }
    function emit(kind, ref) { printf "%s\t%d\t%s\t%s\n", FILENAME, FNR, kind, ref }
    # [text](target): relative file links and #anchors; code spans are not links.
    function scan_links(line,    s, m, target) {
      s = line
      gsub(/`[^`]*`/, "", s)
      while (match(s, /\]\([^) \t]+\)/)) {
        target = substr(s, RSTART + 2, RLENGTH - 3)
        s = substr(s, RSTART + RLENGTH)
        if (target ~ /^[a-z]+:/) continue  # http:, https:, mailto:
        emit("link", target)
      }
    }
    function scan_paths(line,    s, tok, pre) {
      s = line
      gsub(/\]\([^) \t]+\)/, "] ", s)  # link targets are checked as links
      while (match(s, /[A-Za-z0-9_.\/{},*<>-]+/)) {
        tok = substr(s, RSTART, RLENGTH)
        pre = (RSTART > 1) ? substr(s, RSTART - 1, 1) : ""
        s = substr(s, RSTART + RLENGTH)
        if (pre == "/" || pre == "~" || pre == "$") continue  # an absolute, home or variable path
        sub(/[.,:]+$/, "", tok)  # sentence punctuation
        if (gsub(/\{/, "{", tok) < gsub(/\}/, "}", tok)) sub(/\}+$/, "", tok)  # a closing brace of the prose
        if (tok ~ /[<>]/ || tok ~ /\.\.\./) continue  # placeholders
        # A path under a top-level folder: a file (it has an extension) or a folder (it ends in "/");
        # other slashed words there are names of another kind (profile scopes, `attention/check_inputs`).
        if (tok ~ ("^(" tops ")/") && (tok ~ /\/$/ || tok ~ /\.[A-Za-z0-9_*{},]+$/)) emit("path", tok)
        else if (tok ~ /^[A-Za-z0-9_*-][A-Za-z0-9_.\/*-]*\.(h|hpp|cpp|cc|cu|cuh|md|cmake|sh)$/ && tok !~ /^build\//) emit("name", tok)
      }
    }
  ' README.md docs/*.md
}

# GitHub's anchor of a heading: lower case, punctuation other than - and _ dropped, spaces to -.
anchors_of() {
  awk '/^[ \t]*(```|~~~)/ { fence = !fence; next }
       !fence && /^#+ / { h = $0; sub(/^#+ +/, "", h); h = tolower(h); gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h); print h }' "$1"
}

# Expands a{b,c}d and globs against the repository's files; exit 0 when one exists (file or folder).
resolves() {
  local ref="${1%/}" pattern
  local -a alternatives
  if [[ "$ref" =~ ^([^{]*)\{([^}]*)\}(.*)$ ]]; then
    local head="${BASH_REMATCH[1]}" tail="${BASH_REMATCH[3]}" a
    IFS=',' read -ra alternatives <<<"${BASH_REMATCH[2]}"
    for a in "${alternatives[@]}"; do
      resolves "$head$a$tail" || return 1
    done
    return 0
  fi
  pattern="$(sed 's/[.[\^$+?()|]/\\&/g; s/\*/[^\/]*/g' <<<"$ref")"
  grep -Eq "^$pattern(/|$)" "$files"
}

# What the docs name but the repository does not hold, on purpose: files the install or the scripts
# write, and example paths of a user's data and configs.
not_in_repo=(
  'cpformerConfig*.cmake' 'cpformerTargets*.cmake'                    # the installed package files
  summary.md results.md cp_vs_torch.md train_scaling.md               # reports of scripts/gpu/*.sh
  'data/*.bin' configs/x.yaml                                         # a user's shards and config
)
outside() {
  local p
  for p in "${not_in_repo[@]}"; do
    # shellcheck disable=SC2053  # the entries are patterns
    [[ "$1" == $p ]] && return 0
  done
  return 1
}

bad=0
while IFS=$'\t' read -r doc line kind ref; do
  [[ "$kind" != link ]] && outside "$ref" && continue
  case "$kind" in
    path)
      resolves "$ref" || { echo "$doc:$line: $ref is not in the repository"; bad=1; } ;;
    name)  # a file name, or the end of a path (cp/lse_merge.cpp): some file's path ends in it
      pattern="$(sed 's/[.[\^$+?()|]/\\&/g; s/\*/[^\/]*/g' <<<"$ref")"
      grep -Eq "(^|/)$pattern$" "$files" || { echo "$doc:$line: no file named $ref in the repository"; bad=1; } ;;
    link)
      target="${ref%%#*}"
      anchor=""
      [[ "$ref" == *"#"* ]] && anchor="${ref#*#}"
      if [[ -z "$target" ]]; then
        file="$doc"
      else
        file="$(realpath -m --relative-to=. "$(dirname "$doc")/$target")"
        if ! resolves "$file"; then
          echo "$doc:$line: link to $ref: $file is not in the repository"; bad=1; continue
        fi
      fi
      if [[ -n "$anchor" ]] && ! anchors_of "$file" | grep -qxF -- "$anchor"; then
        echo "$doc:$line: link to $ref: $file has no heading with the anchor #$anchor"; bad=1
      fi ;;
  esac
done < <(refs)
exit "$bad"
