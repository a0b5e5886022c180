# Installs the libraries, their headers and a CMake package so other projects can write
#   find_package(cpformer 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE cpformer::autograd)
# Included last from the top-level CMakeLists.txt, once every cpf_add_library() has run.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CPF_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/cpformer" CACHE STRING
    "Where cpformerConfig.cmake is installed, relative to the prefix")

get_property(_cpf_targets GLOBAL PROPERTY CPF_LIBRARY_TARGETS)
# Sanitized static libraries need the sanitizer runtime in whatever links them.
if(CPF_SANITIZE)
  string(REPLACE ";" "," _cpf_san_list "${CPF_SANITIZE}")
  foreach(_t IN LISTS _cpf_targets)
    target_link_options(${_t} INTERFACE $<INSTALL_INTERFACE:-fsanitize=${_cpf_san_list}>)
  endforeach()
endif()

install(TARGETS ${_cpf_targets}
  EXPORT cpformerTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# (The include directory, include/cpformer, is part of each target: see cpf_add_library.)

# Headers keep their paths relative to the repository root, so `#include "framework/tensor/tensor.h"`
# works the same in the tree and against the installed package (include dir: include/cpformer).
foreach(_dir framework attention models)
  if(IS_DIRECTORY "${PROJECT_SOURCE_DIR}/${_dir}")
    install(DIRECTORY "${PROJECT_SOURCE_DIR}/${_dir}/"
      DESTINATION "include/cpformer/${_dir}"
      FILES_MATCHING PATTERN "*.h"
      PATTERN "internal" EXCLUDE)  # the library's own unchecked entries (e.g. attention/cp/internal/)
  endif()
endforeach()

install(EXPORT cpformerTargets
  NAMESPACE cpformer::
  FILE cpformerTargets.cmake
  DESTINATION ${CPF_INSTALL_CMAKEDIR})

# The packages the exported targets link against, re-found by the consumer (find_dependency lines
# for cpformerConfig.cmake). Add one here when a library gains a public dependency.
set(CPF_CONFIG_DEPENDENCIES "find_dependency(Eigen3 3.3 NO_MODULE)\nfind_dependency(Threads)\n")
if(CPF_WITH_OPENMP)
  string(APPEND CPF_CONFIG_DEPENDENCIES "find_dependency(OpenMP COMPONENTS CXX)\n")
endif()
if(CPF_CUDA_ENABLED)
  string(APPEND CPF_CONFIG_DEPENDENCIES "find_dependency(CUDAToolkit)\n")
endif()
# Found in framework/ (a subdirectory), so `if(TARGET ...)` cannot see them from here: both are
# REQUIRED by the build, and the static libraries' link interfaces name their imported targets.
string(APPEND CPF_CONFIG_DEPENDENCIES "find_dependency(nlohmann_json 3)\nfind_dependency(yaml-cpp)\n")
# The tokenizers (models/): ICU's regex engine (CMake's FindICU) and SentencePiece.
string(APPEND CPF_CONFIG_DEPENDENCIES "find_dependency(ICU COMPONENTS uc i18n)\nfind_dependency(CpfSentencepiece)\n")
# SentencePiece, NCCL and cuDNN have no CMake package: the find modules that made their imported targets
# for the build are installed with the config and re-run on the consumer's machine.
set(_cpf_find_modules "${PROJECT_SOURCE_DIR}/cmake/FindCpfSentencepiece.cmake")
if(TARGET cpf_distributed_nccl)
  list(APPEND _cpf_find_modules "${PROJECT_SOURCE_DIR}/cmake/FindCpfNccl.cmake")
  string(APPEND CPF_CONFIG_DEPENDENCIES "find_dependency(CpfNccl)\n")
endif()
if(CPF_CUDA_ENABLED AND CPF_WITH_CUDNN)
  list(APPEND _cpf_find_modules "${PROJECT_SOURCE_DIR}/cmake/FindCpfCudnn.cmake")
  string(APPEND CPF_CONFIG_DEPENDENCIES "find_dependency(CpfCudnn)\n")
endif()
if(_cpf_find_modules)
  string(PREPEND CPF_CONFIG_DEPENDENCIES "list(APPEND CMAKE_MODULE_PATH \"\${CMAKE_CURRENT_LIST_DIR}\")\n")
  install(FILES ${_cpf_find_modules} DESTINATION ${CPF_INSTALL_CMAKEDIR})
endif()
# A static cpf_distributed hands its private libcrypto (the rendezvous's HMAC) to the consumer's link.
if(NOT CPF_SHARED_LIBS)
  string(APPEND CPF_CONFIG_DEPENDENCIES "find_dependency(OpenSSL COMPONENTS Crypto)\n")
endif()

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/cpformerConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/cpformerConfig.cmake"
  INSTALL_DESTINATION ${CPF_INSTALL_CMAKEDIR})
# 0.x: minor versions may break the API, so only the same minor version is compatible.
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/cpformerConfigVersion.cmake"
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  "${PROJECT_BINARY_DIR}/cpformerConfig.cmake"
  "${PROJECT_BINARY_DIR}/cpformerConfigVersion.cmake"
  DESTINATION ${CPF_INSTALL_CMAKEDIR})

# `cmake --build <dir> --target cpf_libraries`: just what `cmake --install` needs.
add_custom_target(cpf_libraries)
add_dependencies(cpf_libraries ${_cpf_targets})
