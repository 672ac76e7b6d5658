# Shared CMake helpers for k3 targets.

# k3_add_library(NAME SOURCES ... DEPS ...)
# Creates target k3_NAME with alias k3::NAME, public headers in include/.
function(k3_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(k3_${name} STATIC ${ARG_SOURCES})
  add_library(k3::${name} ALIAS k3_${name})
  target_include_directories(k3_${name}
    PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(k3_${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
endfunction()

# k3_add_test(NAME SOURCES ... DEPS ... LABELS ...)
# A doctest executable registered with ctest. Test data is found through
# K3_TEST_DATA_DIR (the repository copy) and K3_SHARED_ORACLE_DIR (../shared,
# present only in the developers' workspace and CI). Every test can include
# k3_test_support.h (tests/support).
function(k3_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS;ENV" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE k3_doctest_main k3_test_support ${ARG_DEPS})
  target_compile_definitions(${name} PRIVATE
    K3_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data"
    K3_SHARED_ORACLE_DIR="${PROJECT_SOURCE_DIR}/../shared/oracle"
    K3_BINARY_DIR="${PROJECT_BINARY_DIR}")
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
  if(ARG_ENV)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${ARG_ENV}")
  endif()
endfunction()
