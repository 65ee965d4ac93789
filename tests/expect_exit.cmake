# cmake -DCMD=prog -DARGS="a;b" -DEXPECT=code [-DEXPECT_ERR=text] -P expect_exit.cmake
# Runs CMD ARGS and fails unless it exits with EXPECT (and, when given,
# stdout or stderr contains EXPECT_ERR).
separate_arguments(arg_list UNIX_COMMAND "${ARGS}")
execute_process(COMMAND ${CMD} ${arg_list} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL ${EXPECT})
  message(FATAL_ERROR "'${CMD} ${ARGS}' exited ${rc}, expected ${EXPECT}\nstdout: ${out}\nstderr: ${err}")
endif()
if(DEFINED EXPECT_ERR)
  string(FIND "${out}${err}" "${EXPECT_ERR}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "'${CMD} ${ARGS}' did not print '${EXPECT_ERR}'\nstdout: ${out}\nstderr: ${err}")
  endif()
endif()
