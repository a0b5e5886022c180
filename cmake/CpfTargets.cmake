# One library per framework folder; dependencies are declared explicitly so the compiler and linker
# enforce the layering (core <- tensor <- autograd <- {nn, optim, distributed} <- attention <- models).
#
#   cpf_add_library(NAME tensor DIR framework/tensor DEPS cpf_core PRIVATE_DEPS ...)
# Sources are every *.cpp below DIR, except those in a cuda/ sub-folder (added by the CUDA issue).
function(cpf_add_library)
  cmake_parse_arguments(ARG "" "NAME;DIR" "DEPS;PRIVATE_DEPS" ${ARGN})
  file(GLOB_RECURSE _srcs CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/${ARG_DIR}/*.cpp")
  list(FILTER _srcs EXCLUDE REGEX "/cuda/")
  list(FILTER _srcs EXCLUDE REGEX "/distributed/nccl/")  # its own library, cpf_distributed_nccl
  set(_target cpf_${ARG_NAME})
  if(_srcs)
    add_library(${_target} ${CPF_LIBRARY_KIND} ${_srcs})
    # No <target>_EXPORTS define: the objects stay identical to the static build's (ccache hits).
    set_target_properties(${_target} PROPERTIES DEFINE_SYMBOL "")
    set(_scope PUBLIC)
  else()
    add_library(${_target} INTERFACE)
    set(_scope INTERFACE)
  endif()
  add_library(cpformer::${ARG_NAME} ALIAS ${_target})
  set_target_properties(${_target} PROPERTIES EXPORT_NAME ${ARG_NAME})
  target_include_directories(${_target} ${_scope}
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<INSTALL_INTERFACE:include/cpformer>)
  target_compile_features(${_target} ${_scope} cxx_std_20)
  if(ARG_DEPS)
    target_link_libraries(${_target} ${_scope} ${ARG_DEPS})
  endif()
  if(ARG_PRIVATE_DEPS AND _srcs)
    target_link_libraries(${_target} PRIVATE ${ARG_PRIVATE_DEPS})
  endif()
  if(_srcs)
    target_compile_options(${_target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  endif()
  set_property(GLOBAL APPEND PROPERTY CPF_LIBRARY_TARGETS ${_target})
endfunction()

# Each tests/<dir>/*_test.cpp becomes one executable (a compile error in one file does not stop the
# others) registered with ctest as "<name>/Suite.Test", labelled gradcheck for *_gradcheck_test.cpp and
# 'unit' otherwise. NAME (default: DIR) prefixes the executables ("<name>_<file>", '/' read as '_') and
# the ctest names, so a folder can move to mirror its sources (tests/attention/cp for attention/cp)
# while its binaries keep the names scripts and docs use (NAME cp: cp_cp_equivalence_test).
function(cpf_add_tests)
  cmake_parse_arguments(ARG "" "DIR;NAME" "DEPS" ${ARGN})
  if(NOT ARG_NAME)
    set(ARG_NAME ${ARG_DIR})
  endif()
  file(GLOB _srcs CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/${ARG_DIR}/*_test.cpp")
  foreach(_src IN LISTS _srcs)
    get_filename_component(_name ${_src} NAME_WE)
    set(_exe ${ARG_NAME}_${_name})
    string(REPLACE "/" "_" _exe ${_exe})
    add_executable(${_exe} ${_src})
    target_link_libraries(${_exe} PRIVATE ${ARG_DEPS} cpf_test_support GTest::gtest_main)
    if(_name MATCHES "gradcheck")
      set(_kind gradcheck)
    else()
      set(_kind unit)
    endif()
    # One label (unit or gradcheck); the folder prefixes the test name: ctest -R "^cp/".
    # NO_PRETTY_VALUES: CMake 3.25 otherwise appends "# GetParam() = <bytes>" (pointer values included)
    # to the names of value-parameterized tests that have custom names.
    gtest_discover_tests(${_exe} TEST_PREFIX "${ARG_NAME}/" PROPERTIES LABELS ${_kind} DISCOVERY_TIMEOUT 60
                         NO_PRETTY_VALUES)
  endforeach()
endfunction()

# Find modules of dependencies without a CMake package of their own (FindCpfNccl, FindCpfCudnn); they
# are installed with the package so the consumer re-finds them the same way.
list(APPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")
