# CheckPublicHeaders.cmake: the public_headers test (cmake -P). For every header under
# INCLUDE_ROOT/braid:
#   - its #include lines name only standard headers, Arrow's (<arrow/...>, for Status and
#     Result) and other public headers ("braid/X.h" that exist under INCLUDE_ROOT);
#   - it shows no machinery: no std::thread, mutex, condition variable, GUARDED_BY,
#     `internal::` or `_internal` header;
#   - it compiles alone (a translation unit of one #include) with INCLUDE_ROOT and Arrow's
#     headers as the only include paths, and nothing it pulls in lies under
#     SOURCE_ROOT/cpp/src (the internal headers).
# Variables: CXX, INCLUDE_ROOT, ARROW_INCLUDE_DIR, SOURCE_ROOT, WORK_DIR.
cmake_minimum_required(VERSION 3.24)
foreach(v CXX INCLUDE_ROOT ARROW_INCLUDE_DIR SOURCE_ROOT WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "CheckPublicHeaders.cmake: -D${v}=... is required")
  endif()
endforeach()

file(GLOB headers RELATIVE "${INCLUDE_ROOT}" "${INCLUDE_ROOT}/braid/*.h")
if(NOT headers)
  message(FATAL_ERROR "no public headers under ${INCLUDE_ROOT}/braid")
endif()
file(MAKE_DIRECTORY "${WORK_DIR}")
set(internal_root "${SOURCE_ROOT}/cpp/src")
set(failures 0)
set(forbidden "std::thread" "std::jthread" "mutex" "condition_variable" "GUARDED_BY"
    "internal::" "_internal")

foreach(h IN LISTS headers)
  file(STRINGS "${INCLUDE_ROOT}/${h}" lines)
  foreach(line IN LISTS lines)
    foreach(word IN LISTS forbidden)
      string(FIND "${line}" "${word}" at)
      if(at GREATER -1)
        message(SEND_ERROR "${h}: shows '${word}': ${line}")
        math(EXPR failures "${failures} + 1")
      endif()
    endforeach()
    if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*([<\"])([^>\"]+)[>\"]")
      set(delim "${CMAKE_MATCH_1}")
      set(inc "${CMAKE_MATCH_2}")
      if(inc MATCHES "^braid/")
        if(NOT EXISTS "${INCLUDE_ROOT}/${inc}")
          message(SEND_ERROR "${h}: includes ${inc}, which is not a public header")
          math(EXPR failures "${failures} + 1")
        endif()
      elseif(delim STREQUAL "\"" OR (inc MATCHES "/" AND NOT inc MATCHES "^arrow/"))
        message(SEND_ERROR "${h}: includes ${inc}: neither standard, Arrow's nor public")
        math(EXPR failures "${failures} + 1")
      endif()
    endif()
  endforeach()

  string(MAKE_C_IDENTIFIER "${h}" stem)
  set(tu "${WORK_DIR}/${stem}.cc")
  file(WRITE "${tu}" "#include \"${h}\"\n")
  execute_process(
    COMMAND "${CXX}" -std=c++20 -fsyntax-only -Wall -Wextra -H
            "-I${INCLUDE_ROOT}" -isystem "${ARROW_INCLUDE_DIR}" "${tu}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(SEND_ERROR "${h} does not compile alone:\n${err}")
    math(EXPR failures "${failures} + 1")
    continue()
  endif()
  # -H lists every header opened, one per line, after dots for the depth.
  string(REPLACE "\n" ";" opened "${err}")
  foreach(o IN LISTS opened)
    if(o MATCHES "^\\.+ (.+)$")
      file(REAL_PATH "${CMAKE_MATCH_1}" p)
      cmake_path(IS_PREFIX internal_root "${p}" NORMALIZE in_internal)
      if(in_internal)
        message(SEND_ERROR "${h} pulls in ${p}, which is not a public header")
        math(EXPR failures "${failures} + 1")
      endif()
    endif()
  endforeach()
  message(STATUS "${h}: ok")
endforeach()

list(LENGTH headers n)
if(failures GREATER 0)
  message(FATAL_ERROR "public_headers: ${failures} problem(s) in ${n} headers")
endif()
message(STATUS "public_headers: ${n} headers compile alone and include only public ones")
