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
  target_link_libraries(${NAME} PRIVATE braid_core GTest::gtest_main GTest::gmock)
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
  target_link_libraries(${NAME} PRIVATE braid_core benchmark::benchmark)
  if(TARGET benchmark::benchmark_main)
    target_link_libraries(${NAME} PRIVATE benchmark::benchmark_main)
  endif()
  target_compile_definitions(${NAME} PRIVATE BRAID_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
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
