# cmake -DCHECK=layer_check.sh -DWORK=dir -P layer_check_selftest.cmake
# The layer check on small trees with known answers: a clean tree passes, and
# each kind of upward include fails naming its file and line.
file(REMOVE_RECURSE ${WORK})
function(make_tree)
  file(REMOVE_RECURSE ${WORK})
  foreach(d runtime collectives parallel launcher examples)
    file(MAKE_DIRECTORY ${WORK}/${d})
  endforeach()
  file(WRITE ${WORK}/runtime/tensor.h "#pragma once\n#include <vector>\n#include \"runtime/dtype.h\"\n")
  file(WRITE ${WORK}/collectives/comm.h "#pragma once\n#include \"runtime/tensor.h\"\n")
  file(WRITE ${WORK}/parallel/plan.cc "#include \"collectives/comm.h\"\n#include \"parallel/proto/plan.pb.h\"\n")
  file(WRITE ${WORK}/launcher/worker.cc "#include \"parallel/plan.h\"\n#include \"tessera_version.h\"\n")
  file(WRITE ${WORK}/examples/train.cc "#include \"launcher/worker.h\"\n#include \"parallel/plan.h\"\n")
endfunction()

function(expect_check rc_want pattern)
  execute_process(COMMAND bash ${CHECK} ${WORK} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL ${rc_want})
    message(FATAL_ERROR "layer check exited ${rc}, expected ${rc_want}\n${out}${err}")
  endif()
  if(NOT out MATCHES "${pattern}")
    message(FATAL_ERROR "layer check output does not match '${pattern}':\n${out}${err}")
  endif()
endfunction()

make_tree()
expect_check(0 "none reaches up a layer")

# runtime/ reaching collectives/, on line 4.
make_tree()
file(APPEND ${WORK}/runtime/tensor.h "#include \"collectives/comm.h\"\n")
expect_check(1 "runtime/tensor.h:4: includes \"collectives/comm.h\"")

# collectives/ reaching launcher/ (the bench front-end's old include).
make_tree()
file(WRITE ${WORK}/collectives/bench_cli.h "#pragma once\n  #  include \"launcher/cli.h\"\n")
expect_check(1 "collectives/bench_cli.h:2: includes \"launcher/cli.h\"")

# parallel/ reaching examples/, and launcher/ reaching examples/.
make_tree()
file(APPEND ${WORK}/parallel/plan.cc "#include \"examples/gpt/model.h\"\n")
file(WRITE ${WORK}/launcher/agent.cc "#include \"examples/gpt/model.h\"\n")
expect_check(1 "launcher/agent.cc:1: includes \"examples/gpt/model.h\".*parallel/plan.cc:3: includes \"examples/gpt/model.h\".*2 include")

# A library including tests/.
make_tree()
file(APPEND ${WORK}/collectives/comm.h "#include \"tests/collectives/fork_harness.h\"\n")
expect_check(1 "collectives/comm.h:3: includes \"tests/")

file(REMOVE_RECURSE ${WORK})
