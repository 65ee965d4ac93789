# cmake -DCMD=prog -DARGS="a;b" -DEXPECT=code [-DMATCH=regex] [-DNOT_MATCH=regex] -P expect_exit.cmake
# Runs CMD ARGS and fails unless it exits with EXPECT and, when given, its
# output (stdout and stderr) matches MATCH and does not match NOT_MATCH.
separate_arguments(arg_list UNIX_COMMAND "${ARGS}")
execute_process(COMMAND ${CMD} ${arg_list} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL ${EXPECT})
  message(FATAL_ERROR "'${CMD} ${ARGS}' exited ${rc}, expected ${EXPECT}\nstdout: ${out}\nstderr: ${err}")
endif()
if(DEFINED MATCH AND NOT "${out}${err}" MATCHES "${MATCH}")
  message(FATAL_ERROR "'${CMD} ${ARGS}' did not print '${MATCH}'\nstdout: ${out}\nstderr: ${err}")
endif()
if(DEFINED NOT_MATCH AND "${out}${err}" MATCHES "${NOT_MATCH}")
  message(FATAL_ERROR "'${CMD} ${ARGS}' printed '${NOT_MATCH}'\nstdout: ${out}\nstderr: ${err}")
endif()
