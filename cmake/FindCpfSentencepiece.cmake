# Finds libsentencepiece and libsentencepiece_train (Debian's libsentencepiece-dev) and defines the
# imported targets CpfSentencepiece::sentencepiece and CpfSentencepiece::train (the latter brings the
# former). Used by the build (models/) and installed next to cpformerConfig.cmake, so the exported
# cpformer::models names targets the consumer re-finds instead of this machine's library paths.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_CPF_SENTENCEPIECE QUIET sentencepiece)
endif()
find_path(CPF_SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h HINTS ${PC_CPF_SENTENCEPIECE_INCLUDE_DIRS})
find_library(CPF_SENTENCEPIECE_LIBRARY NAMES sentencepiece HINTS ${PC_CPF_SENTENCEPIECE_LIBRARY_DIRS})
find_library(CPF_SENTENCEPIECE_TRAIN_LIBRARY NAMES sentencepiece_train HINTS ${PC_CPF_SENTENCEPIECE_LIBRARY_DIRS})
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CpfSentencepiece
  REQUIRED_VARS CPF_SENTENCEPIECE_LIBRARY CPF_SENTENCEPIECE_TRAIN_LIBRARY CPF_SENTENCEPIECE_INCLUDE_DIR
  REASON_FAILURE_MESSAGE "libsentencepiece / libsentencepiece_train not found: install the Debian package libsentencepiece-dev (scripts/install-deps.sh)")
if(CpfSentencepiece_FOUND AND NOT TARGET CpfSentencepiece::sentencepiece)
  add_library(CpfSentencepiece::sentencepiece UNKNOWN IMPORTED)
  set_target_properties(CpfSentencepiece::sentencepiece PROPERTIES
    IMPORTED_LOCATION "${CPF_SENTENCEPIECE_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CPF_SENTENCEPIECE_INCLUDE_DIR}")
  add_library(CpfSentencepiece::train UNKNOWN IMPORTED)
  set_target_properties(CpfSentencepiece::train PROPERTIES
    IMPORTED_LOCATION "${CPF_SENTENCEPIECE_TRAIN_LIBRARY}"
    INTERFACE_LINK_LIBRARIES CpfSentencepiece::sentencepiece)
endif()
