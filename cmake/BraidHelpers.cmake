# BraidHelpers.cmake: warning flags, sanitizer flags and test/benchmark helpers.

include_guard(GLOBAL)

# -Wall -Wextra on Braid's own targets (not on nanobind / third-party code).
function(braid_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang,AppleClang>:-Wall -Wextra>)
endfunction()

# Global -fsanitize flags (compile + link) for every target in the build.
macro(braid_enable_sanitizers)
  set(_braid_san_flags
    -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_compile_options(${_braid_san_flags})
  add_link_options(${_braid_san_flags})
  message(STATUS "Sanitizers enabled: ${_braid_san_flags}")
endmacro()

# braid_cc_test(NAME SRC): one GoogleTest executable, tests discovered when ctest runs.
function(braid_cc_test NAME SRC)
  add_executable(${NAME} ${SRC})
  target_link_libraries(${NAME} PRIVATE braid_internal GTest::gtest_main GTest::gmock)
  # BRAID_PYTHON: the build's interpreter, which tests run for servers (moto's S3).
  target_compile_definitions(${NAME} PRIVATE BRAID_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                             BRAID_PYTHON="${Python3_EXECUTABLE}")
  braid_set_warnings(${NAME})
  gtest_discover_tests(${NAME}
    DISCOVERY_MODE PRE_TEST
    DISCOVERY_TIMEOUT 60)
endfunction()

# braid_cc_benchmark(NAME SRC): one Google Benchmark executable. benchmark_main supplies
# main() unless the source has BENCHMARK_MAIN() (both work).
function(braid_cc_benchmark NAME SRC)
  add_executable(${NAME} ${SRC})
  target_link_libraries(${NAME} PRIVATE braid_internal benchmark::benchmark)
  if(TARGET benchmark::benchmark_main)
    target_link_libraries(${NAME} PRIVATE benchmark::benchmark_main)
  endif()
  target_compile_definitions(${NAME} PRIVATE BRAID_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  braid_set_warnings(${NAME})
endfunction()

# Fails unless the compiler is clang with libFuzzer (-fsanitize=fuzzer).
function(braid_check_libfuzzer)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "BRAID_BUILD_FUZZERS=ON needs clang (libFuzzer); the compiler is "
      "${CMAKE_CXX_COMPILER_ID}. config_fuzz_test runs the same checks with any compiler.")
  endif()
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS "-fsanitize=fuzzer")
  check_cxx_source_compiles([=[
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }
]=] BRAID_HAVE_LIBFUZZER)
  if(NOT BRAID_HAVE_LIBFUZZER)
    message(FATAL_ERROR "BRAID_BUILD_FUZZERS=ON: ${CMAKE_CXX_COMPILER} cannot link "
      "-fsanitize=fuzzer (install clang's libFuzzer runtime)")
  endif()
endfunction()

# braid_cc_fuzzer(NAME SRC): one libFuzzer executable (ASan + UBSan unless BRAID_SANITIZE
# already adds them to every target).
function(braid_cc_fuzzer NAME SRC)
  add_executable(${NAME} ${SRC})
  target_link_libraries(${NAME} PRIVATE braid_internal)
  set(_flags -fsanitize=fuzzer)
  if(NOT BRAID_SANITIZE)
    list(APPEND _flags -fsanitize=address,undefined -fno-omit-frame-pointer)
  endif()
  target_compile_options(${NAME} PRIVATE ${_flags})
  target_link_options(${NAME} PRIVATE ${_flags})
  braid_set_warnings(${NAME})
endfunction()

# Fail early when two sources share a stem (the executable name).
function(braid_check_unique_stems kind)
  set(seen "")
  foreach(src IN LISTS ARGN)
    get_filename_component(stem "${src}" NAME_WE)
    if(stem IN_LIST seen)
      message(FATAL_ERROR "Two ${kind} sources named ${stem}.cc; executable names must be unique")
    endif()
    list(APPEND seen ${stem})
  endforeach()
endfunction()
