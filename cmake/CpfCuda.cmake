# Resolve CPF_WITH_CUDA (AUTO/ON/OFF) into CPF_CUDA_ENABLED and enable the CUDA language when on.
# CUDA code is private to the *_cuda sources; public headers never include CUDA headers, so the
# CPU-only build is always possible.
#
#   AUTO  on when an nvcc is found (CUDACXX, PATH, or the toolkit in /usr/local/cuda), else off.
#         This is what CI uses: it compiles the CUDA code wherever the toolkit exists.
#   ON    nvcc is required; configuring fails without it.
#   OFF   CUDA is never looked at.
# Works with no .cu file in the tree: enabling the language only checks that nvcc compiles.

string(TOUPPER "${CPF_WITH_CUDA}" _cpf_cuda_mode)
if(NOT _cpf_cuda_mode MATCHES "^(AUTO|ON|OFF|TRUE|FALSE|YES|NO|1|0)$")
  message(FATAL_ERROR "CPF_WITH_CUDA must be AUTO, ON or OFF, got '${CPF_WITH_CUDA}'")
endif()

# nvcc is often not on PATH (e.g. CI's environment): point CUDACXX, which both check_language and
# enable_language read, at the toolkit's standard place.
if(NOT _cpf_cuda_mode MATCHES "^(OFF|FALSE|NO|0)$" AND NOT DEFINED CMAKE_CUDA_COMPILER
   AND NOT DEFINED ENV{CUDACXX})
  find_program(_cpf_nvcc nvcc HINTS /usr/local/cuda/bin NO_CACHE)
  if(_cpf_nvcc)
    set(ENV{CUDACXX} "${_cpf_nvcc}")
  endif()
endif()

if(_cpf_cuda_mode STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CPF_CUDA_ENABLED ON)
  else()
    set(CPF_CUDA_ENABLED OFF)
  endif()
elseif(_cpf_cuda_mode MATCHES "^(ON|TRUE|YES|1)$")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    message(FATAL_ERROR "CPF_WITH_CUDA=ON but no nvcc was found (looked on PATH and in /usr/local/cuda/bin). "
                        "Set CUDACXX or CMAKE_CUDA_COMPILER, or configure with CPF_WITH_CUDA=AUTO or OFF.")
  endif()
  set(CPF_CUDA_ENABLED ON)
else()
  set(CPF_CUDA_ENABLED OFF)
endif()

if(CPF_CUDA_ENABLED)
  # Must be set before enable_language, or CMake picks the toolkit's default architecture.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES ${CPF_CUDA_ARCHITECTURES})
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "cpformer: CUDA ${CMAKE_CUDA_COMPILER_VERSION} at ${CMAKE_CUDA_COMPILER}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES}")
else()
  # Lets option checks elsewhere (cuDNN, NCCL) read one variable whatever the mode.
  set(CPF_WITH_CUDNN OFF)
  set(CPF_WITH_NCCL OFF)
endif()
message(STATUS "cpformer: CUDA backend ${CPF_CUDA_ENABLED} (CPF_WITH_CUDA=${CPF_WITH_CUDA})")
