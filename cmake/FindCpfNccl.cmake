# Finds NCCL (nccl.h, libnccl) and defines the imported target CpfNccl::nccl.
# Used by the build (framework/distributed/nccl) and installed next to cpformerConfig.cmake, so the
# exported cpformer::distributed_nccl names a target the consumer re-finds on its own machine instead
# of this machine's absolute library path.
find_path(CPF_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
find_library(CPF_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CpfNccl
  REQUIRED_VARS CPF_NCCL_LIBRARY CPF_NCCL_INCLUDE_DIR
  REASON_FAILURE_MESSAGE "NCCL (nccl.h / libnccl.so) not found in the CUDA toolkit: install NCCL, set CPF_NCCL_LIBRARY and CPF_NCCL_INCLUDE_DIR, or build cpformer with -DCPF_WITH_NCCL=OFF")
if(CpfNccl_FOUND AND NOT TARGET CpfNccl::nccl)
  add_library(CpfNccl::nccl UNKNOWN IMPORTED)
  set_target_properties(CpfNccl::nccl PROPERTIES
    IMPORTED_LOCATION "${CPF_NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CPF_NCCL_INCLUDE_DIR}")
endif()
