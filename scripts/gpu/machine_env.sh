# Sourced by the scripts of scripts/gpu/ (not run): the environment of the GPU machines (docs/gpu.md).
#
#   cpf_gpu_env LIB_DIR
#     LD_LIBRARY_PATH: LIB_DIR (the carried build's lib/) first, then cuBLAS, cuDNN and NCCL of the
#     machine's PyTorch venv when present (the system cuDNN 9.14 has a known sliding-window bug), then
#     the CUDA toolkit's; NCCL_NVLS_ENABLE=0 (NVLink multicast off on the shared machines); PYTHON: the
#     venv's python3 unless set, else python3 from PATH.
cpf_gpu_env() {
  local nv=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
  export LD_LIBRARY_PATH="$1:$nv/cublas/lib:$nv/cudnn/lib:$nv/nccl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  export NCCL_NVLS_ENABLE=0
  PYTHON="${PYTHON:-/opt/torch/.venv/bin/python3}"
  [[ -x "$PYTHON" ]] || PYTHON=python3
}
