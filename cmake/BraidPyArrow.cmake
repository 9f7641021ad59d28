# BraidPyArrow.cmake
#
# Arrow C++ / Parquet / Arrow Dataset come from the pyarrow wheel: headers live at
# pyarrow.get_include() and the shared libraries (versioned names only, e.g.
# libarrow.so.2600; there is no libarrow.so and no ArrowConfig.cmake) next to
# pyarrow/__init__.py. This module asks a Python interpreter where they are and
# declares IMPORTED SHARED targets:
#
#   braid::arrow          libarrow
#   braid::arrow_compute  libarrow_compute   (compute kernels, split out in Arrow >= 21)
#   braid::arrow_acero    libarrow_acero
#   braid::parquet        libparquet         (-> braid::arrow)
#   braid::arrow_dataset  libarrow_dataset   (-> parquet, acero, compute, arrow)
#   braid::arrow_s3       libarrow_s3        (-> arrow; Arrow >= 26 ships S3 apart: its
#                         library registers the s3:// URI factory when it is loaded, so
#                         a binary that links it opens s3:// without pyarrow.fs)
#
# Outputs:
#   BRAID_PYARROW_VERSION_FOUND  pyarrow.__version__
#   BRAID_PYARROW_INCLUDE_DIR    pyarrow.get_include()
#   BRAID_PYARROW_LIB_DIR        folder holding libarrow.so.<N> (the pyarrow package dir)
#
# Interpreter: Python3_EXECUTABLE if set, else Python_EXECUTABLE, else
# <source>/.venv/bin/python if present (and no virtualenv is active), else
# find_package(Python3 COMPONENTS Interpreter).
#
# pyarrow.create_library_symlinks() is deliberately NOT used: it writes into the
# installed pyarrow package; we link against the versioned files directly.

include_guard(GLOBAL)

set(BRAID_PYARROW_VERSION "26.0.1" CACHE STRING "pyarrow version the build is pinned to")

if(NOT Python3_EXECUTABLE)
  if(Python_EXECUTABLE)
    set(Python3_EXECUTABLE "${Python_EXECUTABLE}" CACHE FILEPATH "Python 3 interpreter")
  elseif(NOT DEFINED ENV{VIRTUAL_ENV} AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(Python3_EXECUTABLE "${PROJECT_SOURCE_DIR}/.venv/bin/python"
        CACHE FILEPATH "Python 3 interpreter")
  endif()
endif()
if(NOT Python3_EXECUTABLE)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
endif()

execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
    "import pyarrow as pa; print(pa.__version__); print(pa.get_include()); print('\\n'.join(pa.get_library_dirs()))"
  RESULT_VARIABLE _braid_pa_rc
  OUTPUT_VARIABLE _braid_pa_out
  ERROR_VARIABLE _braid_pa_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _braid_pa_rc EQUAL 0)
  message(FATAL_ERROR
    "Cannot import pyarrow with ${Python3_EXECUTABLE}:\n${_braid_pa_err}\n"
    "Install pyarrow==${BRAID_PYARROW_VERSION} into that interpreter (scripts/setup does) "
    "or pass -DPython3_EXECUTABLE=<venv>/bin/python.")
endif()

string(REPLACE "\n" ";" _braid_pa_lines "${_braid_pa_out}")
list(POP_FRONT _braid_pa_lines BRAID_PYARROW_VERSION_FOUND BRAID_PYARROW_INCLUDE_DIR)
set(_braid_pa_libdirs ${_braid_pa_lines})

if(NOT BRAID_PYARROW_VERSION_FOUND VERSION_EQUAL BRAID_PYARROW_VERSION)
  message(WARNING
    "pyarrow ${BRAID_PYARROW_VERSION_FOUND} found, but the project is pinned to "
    "${BRAID_PYARROW_VERSION}; the wheel will load whatever pyarrow is installed at run time.")
endif()
if(NOT EXISTS "${BRAID_PYARROW_INCLUDE_DIR}/arrow/api.h")
  message(FATAL_ERROR "pyarrow include dir ${BRAID_PYARROW_INCLUDE_DIR} has no arrow/api.h")
endif()

# Find one versioned library file: lib<name>.so.<N> (shortest match wins, i.e. the
# SONAME-style file rather than lib<name>.so.<N>.<minor>.<patch> if both exist).
function(_braid_pyarrow_find_lib out name)
  foreach(dir IN LISTS _braid_pa_libdirs)
    if(APPLE)
      file(GLOB cands "${dir}/lib${name}.*.dylib")
    else()
      file(GLOB cands "${dir}/lib${name}.so.*")
    endif()
    if(cands)
      list(SORT cands COMPARE NATURAL)
      list(GET cands 0 first)
      set(${out} "${first}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  message(FATAL_ERROR "lib${name} not found in pyarrow library dirs: ${_braid_pa_libdirs}")
endfunction()

_braid_pyarrow_find_lib(_braid_libarrow arrow)
get_filename_component(BRAID_PYARROW_LIB_DIR "${_braid_libarrow}" DIRECTORY)

function(_braid_pyarrow_target tgt libname)
  _braid_pyarrow_find_lib(loc ${libname})
  get_filename_component(soname "${loc}" NAME)
  add_library(${tgt} SHARED IMPORTED GLOBAL)
  set_target_properties(${tgt} PROPERTIES
    IMPORTED_LOCATION "${loc}"
    IMPORTED_SONAME "${soname}"
    INTERFACE_INCLUDE_DIRECTORIES "${BRAID_PYARROW_INCLUDE_DIR}"
    INTERFACE_COMPILE_FEATURES cxx_std_20
    INTERFACE_LINK_LIBRARIES "${ARGN}")
endfunction()

if(NOT TARGET braid::arrow)
  _braid_pyarrow_target(braid::arrow arrow Threads::Threads)
  _braid_pyarrow_target(braid::arrow_compute arrow_compute braid::arrow)
  _braid_pyarrow_target(braid::arrow_acero arrow_acero braid::arrow_compute braid::arrow)
  _braid_pyarrow_target(braid::parquet parquet braid::arrow)
  _braid_pyarrow_target(braid::arrow_dataset arrow_dataset
    braid::parquet braid::arrow_acero braid::arrow_compute braid::arrow)
  _braid_pyarrow_target(braid::arrow_s3 arrow_s3 braid::arrow)
endif()

message(STATUS "pyarrow ${BRAID_PYARROW_VERSION_FOUND} (${Python3_EXECUTABLE})")
message(STATUS "  Arrow headers: ${BRAID_PYARROW_INCLUDE_DIR}")
message(STATUS "  Arrow libs:    ${BRAID_PYARROW_LIB_DIR}")
