#!/usr/bin/env bash
# Installs the Debian packages cpformer builds against (Debian 12 / Ubuntu 24.04). Idempotent: when
# every package is already installed it returns at once, without touching apt. Works as root, or as
# a user with sudo. The CUDA toolkit is not a Debian package here: it is expected in /usr/local/cuda
# and only needed for the CUDA build (CPF_WITH_CUDA=AUTO skips it when absent).
#
#   scripts/install-deps.sh           # install what is missing
#   scripts/install-deps.sh --check   # exit 1 and list what is missing, install nothing
set -euo pipefail

packages=(
  build-essential
  cmake
  ninja-build
  ccache
  libeigen3-dev
  libyaml-cpp-dev
  googletest
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  nlohmann-json3-dev
  libxxhash-dev
  libssl-dev
  pkg-config
  libicu-dev
  libsentencepiece-dev
  clang-format  # scripts/check_format.sh and its ctest (the style of .clang-format)
  librsvg2-bin  # rsvg-convert: the PNG of cpformer plot (optional at run time; the tests then check it)
)

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages are installed"
  exit 0
fi
echo "install-deps: missing: ${missing[*]}"
if [[ "${1:-}" == "--check" ]]; then
  exit 1
fi

if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "install-deps: not root and no sudo: install these packages as root: ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: installed ${missing[*]}"
