# ctest driver for a sanitizer gate: runs GATE (a program with a deliberate bug) and passes only
# when it exits non-zero with EXPECT (the sanitizer's report) on its output. The sanitizer
# options come from the environment make test-asan / test-tsan set.
execute_process(COMMAND ${GATE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${GATE} exited 0: the sanitizer did not stop it\n${out}${err}")
endif()
string(FIND "${err}${out}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${GATE} exited ${rc} without \"${EXPECT}\" on its output\n${out}${err}")
endif()
message(STATUS "${GATE}: exit ${rc} with \"${EXPECT}\", as it should")
