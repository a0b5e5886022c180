# Finds cuDNN 9 (cudnn_graph.h, libcudnn) and defines the imported target CpfCudnn::cudnn.
# Used by the build (attention/cuda) and installed next to cpformerConfig.cmake, so the exported
# cpformer::attention_cuda names a target the consumer re-finds instead of an absolute path.
find_path(CPF_CUDNN_INCLUDE_DIR cudnn_graph.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
find_library(CPF_CUDNN_LIBRARY NAMES cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CpfCudnn
  REQUIRED_VARS CPF_CUDNN_LIBRARY CPF_CUDNN_INCLUDE_DIR
  REASON_FAILURE_MESSAGE "cuDNN 9 (cudnn_graph.h / libcudnn.so) not found: install cuDNN 9, set CPF_CUDNN_LIBRARY and CPF_CUDNN_INCLUDE_DIR, or build cpformer with -DCPF_WITH_CUDNN=OFF")
if(CpfCudnn_FOUND AND NOT TARGET CpfCudnn::cudnn)
  add_library(CpfCudnn::cudnn UNKNOWN IMPORTED)
  set_target_properties(CpfCudnn::cudnn PROPERTIES
    IMPORTED_LOCATION "${CPF_CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CPF_CUDNN_INCLUDE_DIR}")
endif()
