#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries on a development machine (CUDA toolkit, no GPU needed)
# and gathers what the GPU machines need into one folder that travels with the device tool's `carry`:
#
#   scripts/gpu/build.sh            # -> build/gpu-carry/{bin/*, lib/libbenchmark.so.1debian}
#   BUILD_DIR=... CARRY_DIR=... PACK_DIR=... JOBS=... scripts/gpu/build.sh
#
# The libraries are built shared (CPF_SHARED_LIBS, with the shared cudart, both carried in lib/): static
# binaries hold cudart and every kernel each (13-16 MB apiece), so the whole suite outgrew the device
# tool's 64 MiB carry limit; shared, every test binary and benchmark fits in one carry. SHARED=0
# builds static binaries instead (build/gpu). The folder is also packed as $PACK_DIR/carry.tar.gz
# (default build/gpu-carry-pack); run_suite.sh takes either.
#
# Then, on the GPU machine: scripts/gpu/run_suite.sh (reads build/gpu-carry, writes to $OUT).
# cuBLASLt, cuDNN and NCCL come from the GPU machine (run_suite.sh sets the path); the cpf libraries,
# cudart and Google Benchmark's shared library travel in lib/ (the GPU machines lack the latter).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SHARED="${SHARED:-1}"
if [[ "$SHARED" == 1 ]]; then BUILD_DIR="${BUILD_DIR:-$ROOT/build/gpushared}"; else BUILD_DIR="${BUILD_DIR:-$ROOT/build/gpu}"; fi
CARRY_DIR="${CARRY_DIR:-$ROOT/build/gpu-carry}"
JOBS="${JOBS:-2}"

cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCPF_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCPF_BUILD_BENCHMARKS=ON -DCPF_BUILD_TESTS=ON \
  -DCPF_SHARED_LIBS="$([[ "$SHARED" == 1 ]] && echo ON || echo OFF)"

# Every GPU test (tests/tensor/cuda, tests/attention/cuda, tests/distributed/nccl: NAME_test.cpp) is one
# target <prefix>_NAME_test (cuda_, cuda_attention_, cuda_distributed_); every benchmarks/gpu/NAME_bench.cpp
# is gpu_NAME_bench. TARGETS (space-separated) restricts the build to some of them.
tests=()
for pair in tensor/cuda:cuda attention/cuda:cuda_attention distributed/nccl:cuda_distributed; do
  dir="$ROOT/tests/${pair%%:*}"
  prefix="${pair##*:}"
  [[ "$prefix" == cuda_distributed && ! -d "$ROOT/framework/distributed/nccl" ]] && continue
  for f in "$dir"/*_test.cpp; do [[ -e "$f" ]] && tests+=("${prefix}_$(basename "$f" .cpp)"); done
done
benches=()
for f in "$ROOT"/benchmarks/gpu/*_bench.cpp; do benches+=("gpu_$(basename "$f" .cpp)"); done
# EXTRA_TESTS: more test targets to carry (e.g. the device-parameterised autograd suites).
if [[ -n "${EXTRA_TESTS:-}" ]]; then read -r -a extra <<<"$EXTRA_TESTS"; tests+=("${extra[@]}"); fi
if [[ -n "${TARGETS:-}" ]]; then
  read -r -a wanted <<<"$TARGETS"
  keep() { local t; for t in "${wanted[@]}"; do [[ "$t" == "$1" ]] && return 0; done; return 1; }
  tests=($(for t in "${tests[@]}"; do if keep "$t"; then echo "$t"; fi; done))
  benches=($(for b in "${benches[@]}"; do if keep "$b"; then echo "$b"; fi; done))
fi
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${tests[@]}" "${benches[@]}"

rm -rf "$CARRY_DIR"
mkdir -p "$CARRY_DIR/bin" "$CARRY_DIR/lib"
for t in "${tests[@]}"; do cp "$BUILD_DIR/tests/$t" "$CARRY_DIR/bin/"; done
for b in "${benches[@]}"; do cp "$BUILD_DIR/benchmarks/gpu/$b" "$CARRY_DIR/bin/"; done
# The apps (GPU training runs) when asked for, and always for the multi-GPU training test, which starts
# cpformer from the folder it runs in.
if [[ -n "${WITH_APPS:-}" || " ${tests[*]} " == *" cuda_distributed_train_nccl_test "* ]]; then
  cmake --build "$BUILD_DIR" -j "$JOBS" --target cpformer
  cp "$BUILD_DIR/apps/cpformer" "$CARRY_DIR/bin/"
fi
# Shared build: the cpf libraries and the CUDA runtime they were linked against (the binaries' RUNPATH
# points into the build tree; run_suite.sh puts lib/ first on LD_LIBRARY_PATH).
if [[ "$SHARED" == 1 ]]; then
  find "$BUILD_DIR" -name 'libcpf_*.so' -exec cp {} "$CARRY_DIR/lib/" \;
  # What the GPU machines lack (Ubuntu 24.04 has another ICU soname and no SentencePiece).
  for dep in libcudart libyaml-cpp libicui18n libicuuc libicudata libsentencepiece_train libsentencepiece; do
    path="$(ldd "$CARRY_DIR"/lib/libcpf_*.so | awk -v d="$dep.so" 'index($1, d) == 1 && !p {print $3; p = 1}')"
    [[ -n "$path" ]] && cp -L "$path" "$CARRY_DIR/lib/"
  done
fi
strip --strip-unneeded "$CARRY_DIR"/bin/* "$CARRY_DIR"/lib/libcpf_*.so 2>/dev/null || true

# The benchmark library under the soname the binaries ask for.
# (None when TARGETS names no benchmark: ldd of a missing file must not end the script under set -e.)
bench_lib=""
[[ ${#benches[@]} -gt 0 ]] && bench_lib="$(ldd "$CARRY_DIR/bin/${benches[0]}" 2>/dev/null | awk '/libbenchmark/ {print $3; exit}')"
if [[ -n "$bench_lib" ]]; then
  soname="$(ldd "$CARRY_DIR/bin/${benches[0]}" | awk '/libbenchmark/ {print $1; exit}')"
  cp -L "$bench_lib" "$CARRY_DIR/lib/$soname"
fi

PACK_DIR="${PACK_DIR:-${CARRY_DIR}-pack}"
mkdir -p "$PACK_DIR"
tar -C "$(dirname "$CARRY_DIR")" -czf "$PACK_DIR/carry.tar.gz" "$(basename "$CARRY_DIR")"
du -sh "$CARRY_DIR" "$PACK_DIR/carry.tar.gz"
echo "carry: ${PACK_DIR#$ROOT/} (then scripts/gpu/run_suite.sh ${PACK_DIR#$ROOT/}/carry.tar.gz on the GPU machine)"
