# Installs the built loom into WORK_DIR/prefix, then builds and runs tests/install/main.cpp
# against it with find_package(loom CONFIG). Any failing step fails the test.
# Two runs at once (ctest --repeat, -j) must not share it: WORK_DIR becomes a directory of this
# run's own below it, removed at the end (Note [Test scratch directories], tests/scratch_dir.h).
# Every step runs there (main.cpp writes a file into its working directory).
set(runs ${WORK_DIR})
file(MAKE_DIRECTORY ${runs})
execute_process(COMMAND mktemp -d ${runs}/run.XXXXXX RESULT_VARIABLE rc
                OUTPUT_VARIABLE WORK_DIR OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mktemp -d ${runs}/run.XXXXXX failed (${rc})")
endif()
function(run)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    file(REMOVE_RECURSE ${WORK_DIR})
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${LOOM_BINARY_DIR} --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "installed loom found, linked and ran")
