# cmake -DCMD=prog -DARGS="a;b" -DEXPECT=code -P expect_exit.cmake
# Runs CMD ARGS and fails unless it exits with EXPECT.
separate_arguments(arg_list UNIX_COMMAND "${ARGS}")
execute_process(COMMAND ${CMD} ${arg_list} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL ${EXPECT})
  message(FATAL_ERROR "'${CMD} ${ARGS}' exited ${rc}, expected ${EXPECT}\nstdout: ${out}\nstderr: ${err}")
endif()
