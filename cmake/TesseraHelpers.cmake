# tessera_require_package(<Name> "<debian packages>" [CONFIG])
# find_package that stops configure with the Debian package to install.
macro(tessera_require_package name debs)
  find_package(${name} ${ARGN} QUIET)
  if(NOT ${name}_FOUND)
    message(FATAL_ERROR
      "tessera: dependency '${name}' not found. Install the Debian package(s): ${debs}\n"
      "  (scripts/install-deps.sh installs everything tessera needs)")
  endif()
endmacro()

# TESSERA_SANITIZER_ENV: the environment every test runs with (set it on any
# add_test as ENVIRONMENT). Under ASan, OpenMPI's own allocations would be
# reported as leaks; under TSan, Debian's gRPC, abseil, protobuf, spdlog and
# OpenMPI are not instrumented, so their own synchronisation is invisible and
# shows as races. Both suppression lists name third-party libraries only
# (tests/sanitizers/). Processes a test starts inherit it (mpirun passes it to
# its local ranks; the multihost rig into its namespaces). Under ASan,
# allocation stacks are unwound fully (fast_unwind_on_malloc=0): OpenMPI's
# plugins allocate in MPI_Init and are dlclosed before the leak check, so the
# fast unwinder's stack ends at an "<unknown module>" frame no suppression can
# name, where the full one reaches libmpi.so (about 25% slower on gRPC-heavy
# tests).
if(TESSERA_SANITIZE STREQUAL "thread")
  set(TESSERA_SANITIZER_ENV "TSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/sanitizers/tsan.supp")
else()
  set(TESSERA_SANITIZER_ENV
      "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/sanitizers/lsan.supp:fast_unwind_on_malloc=0")
endif()

# TESSERA_SANITIZER_TIMEOUT_FACTOR: a test's timeout catches hangs, and a
# sanitizer's own slowdown is not one. On a 2-core machine (2026-12-06) the
# 655365-element TCP ring all-reduce test took 118 s of its 120 under
# ThreadSanitizer against 7.6 s plain (15x); the bench, launcher and fault
# tests took 147 s under AddressSanitizer against 54 s plain (2.7x). The
# timeouts already leave a margin over the plain times; these factors keep it
# under a sanitizer.
if(TESSERA_SANITIZE STREQUAL "thread")
  set(TESSERA_SANITIZER_TIMEOUT_FACTOR 5)
elseif(TESSERA_SANITIZE)
  set(TESSERA_SANITIZER_TIMEOUT_FACTOR 3)
else()
  set(TESSERA_SANITIZER_TIMEOUT_FACTOR 1)
endif()

# tessera_sanitize_directory_tests(): call at the end of a CMakeLists.txt
# with plain add_test() tests. Under a sanitizer, scales each one's TIMEOUT
# (scripts/test.sh's 600 s where it sets none) by the factor above and gives
# it TESSERA_SANITIZER_ENV, as tessera_add_test does for GoogleTest ones.
function(tessera_sanitize_directory_tests)
  if(TESSERA_SANITIZER_TIMEOUT_FACTOR EQUAL 1)
    return()
  endif()
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t IN LISTS tests)
    get_test_property(${t} TIMEOUT timeout)
    if(NOT timeout)
      set(timeout 600)
    endif()
    math(EXPR timeout "${timeout} * ${TESSERA_SANITIZER_TIMEOUT_FACTOR}")
    set_tests_properties(${t} PROPERTIES TIMEOUT ${timeout})
    get_test_property(${t} ENVIRONMENT env)
    if(NOT "${TESSERA_SANITIZER_ENV}" IN_LIST env)
      set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "${TESSERA_SANITIZER_ENV}")
    endif()
  endforeach()
endfunction()

# tessera_add_test(<name> SOURCES a.cc b.cc LIBS lib1 lib2 [LABELS l1 l2] [TIMEOUT s] [SERIAL])
# One GoogleTest executable registered with ctest, one ctest entry per TEST().
function(tessera_add_test name)
  cmake_parse_arguments(T "SERIAL" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main tessera_flags)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin/tests)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  math(EXPR T_TIMEOUT "${T_TIMEOUT} * ${TESSERA_SANITIZER_TIMEOUT_FACTOR}")
  set(props TIMEOUT ${T_TIMEOUT} ENVIRONMENT "${TESSERA_SANITIZER_ENV}")
  if(T_SERIAL)
    # Measures time against a peer: nothing else may run beside it.
    list(APPEND props RUN_SERIAL TRUE)
  endif()
  if(T_LABELS)
    # An empty LABELS value would vanish from the list and shift the pairs.
    list(APPEND props LABELS "${T_LABELS}")
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES ${props})
endfunction()
