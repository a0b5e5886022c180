#!/usr/bin/env bash
# docs/architecture.md, "Device dispatch", names every device table registration of the libraries (each
# register_device_* call and the file making it), and the CUDA backend fills every DeviceOps entry
# (framework/tensor/device_ops.h's fields against framework/tensor/cuda/ops.cpp's `t.<entry> = `).
#   tests/docs/dispatch_tables_test.sh <repository root>
set -euo pipefail
root="${1:?usage: dispatch_tables_test.sh <repository root>}"
section="$(awk '/^## Device dispatch/{f=1; next} /^## /{f=0} f' "$root/docs/architecture.md")"
fail=0
[[ -n "$section" ]] || { echo "docs/architecture.md has no section '## Device dispatch'"; exit 1; }

# Registration calls (indented: the definitions start their line with their return type).
calls="$(cd "$root" && grep -rnoE '^\s+([a-z_]+::)*register_device_[a-z_]+\(' --include=*.cpp framework attention models apps)"
[[ -n "$calls" ]] || { echo "no register_device_* call found under $root (wrong root?)"; exit 1; }
while IFS= read -r line; do
  file="${line%%:*}"
  fn="$(grep -oE 'register_device_[a-z_]+' <<<"$line")"
  [[ "$section" == *"$fn"* ]] || { echo "docs/architecture.md, Device dispatch: $fn (called in $file) is not listed"; fail=1; }
  [[ "$section" == *"$file"* ]] || { echo "docs/architecture.md, Device dispatch: $file (calls $fn) is not named"; fail=1; }
done <<<"$calls"

# Every DeviceOps entry is filled by the CUDA table.
entries="$(awk '/^struct DeviceOps \{/{f=1} f && /^\};/{f=0} f' "$root/framework/tensor/device_ops.h" |
  grep -oE '\(\*[a-z_0-9]+\)' | tr -d '(*)' | sort -u)"
filled="$(grep -oE '^\s+t\.[a-z_0-9]+ =' "$root/framework/tensor/cuda/ops.cpp" | sed -E 's/^\s+t\.//; s/ =$//' | sort -u)"
[[ -n "$entries" ]] || { echo "found no DeviceOps entries in framework/tensor/device_ops.h"; exit 1; }
missing="$(comm -23 <(echo "$entries") <(echo "$filled"))"
[[ -z "$missing" ]] || { echo "framework/tensor/cuda/ops.cpp leaves DeviceOps entries empty: $(echo $missing)"; fail=1; }

[[ $fail -eq 0 ]] && echo "dispatch_tables_test: $(wc -l <<<"$calls") registrations listed, $(wc -l <<<"$entries") DeviceOps entries filled"
exit "$fail"
