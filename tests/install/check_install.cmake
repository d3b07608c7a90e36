# Installs the built loom into a prefix, then: runs the installed resnet18_cifar from the
# prefix (it must find its libraries through its RUNPATH, with no LD_LIBRARY_PATH), checks the
# libraries' versioned SONAMEs, that only the CUDA backend libraries need CUDA ones, that a GPU
# request without a usable CUDA is refused naming what is missing, builds and runs
# tests/install/main.cpp against the prefix with find_package(loom CONFIG) and, where pkg-config
# is installed, with loom.pc. Any failing step fails the test.
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
set(prefix ${WORK_DIR}/prefix)

# The installed app runs where it is installed.
run(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${prefix}/bin/resnet18_cifar
    --dataset synthetic --synthetic-size 64 --batch-size 32 --epochs 1 --width 4 --max-steps 2
    --threads 1 --workers 0)

# Each layer's library: libloom_<layer>.so -> .so.MAJOR.MINOR -> .so.VERSION, the SONAME naming
# MAJOR.MINOR.
find_program(READELF readelf)
foreach(layer tensor autograd data nn optim dist)
  file(GLOB versioned ${prefix}/lib*/libloom_${layer}.so.*.*)
  if(LOOM_SHARED AND NOT versioned)
    message(FATAL_ERROR "no versioned libloom_${layer}.so.MAJOR.MINOR under ${prefix}")
  endif()
  if(LOOM_SHARED AND READELF)
    file(GLOB library ${prefix}/lib*/libloom_${layer}.so)
    execute_process(COMMAND ${READELF} -d ${library} OUTPUT_VARIABLE dynamic)
    if(NOT dynamic MATCHES "SONAME[^\n]*libloom_${layer}\\.so\\.[0-9]+\\.[0-9]+\\]")
      message(FATAL_ERROR "libloom_${layer}.so has no versioned SONAME:\n${dynamic}")
    endif()
  endif()
endforeach()
# Note [The CUDA backend library]: no layer library needs a CUDA library; the backend libraries
# are installed beside them, versioned too.
if(LOOM_SHARED AND READELF)
  foreach(layer tensor autograd data nn optim dist)
    file(GLOB library ${prefix}/lib*/libloom_${layer}.so)
    execute_process(COMMAND ${READELF} -d ${library} OUTPUT_VARIABLE dynamic)
    if(dynamic MATCHES "NEEDED[^\n]*(libcuda|libcublas|libcudnn|libnccl)")
      message(FATAL_ERROR "libloom_${layer}.so needs a CUDA library:\n${dynamic}")
    endif()
  endforeach()
endif()
if(LOOM_WITH_CUDA)
  foreach(backend cuda nccl)
    file(GLOB versioned ${prefix}/lib*/libloom_${backend}.so.*.*)
    if(NOT versioned)
      message(FATAL_ERROR "no versioned libloom_${backend}.so.MAJOR.MINOR under ${prefix}")
    endif()
  endforeach()
endif()

# An install on a machine without the CUDA libraries trains on the CPU, and says what is missing
# when a GPU is asked for. Simulated on a copy of the prefix whose libloom_cuda names a CUDA
# runtime that does not exist (the name of the one it needs changed in place, same length).
# Without CUDA the request says that loom was built without it.
set(gpu_run ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH)
set(small --dataset synthetic --synthetic-size 64 --batch-size 32 --epochs 1 --width 4
          --max-steps 2 --threads 1 --workers 0)
set(expected "built without CUDA")
set(app ${prefix}/bin/resnet18_cifar)
if(LOOM_WITH_CUDA)
  file(COPY ${prefix}/ DESTINATION ${WORK_DIR}/no_cuda)
  file(GLOB backend ${WORK_DIR}/no_cuda/lib*/libloom_cuda.so.*.*.*)
  find_program(SED sed REQUIRED)
  run(${SED} -i -e "s/libcudart\\.so/libcudarX.so/g" -e "s/libcublas\\.so/libcublaX.so/g" ${backend})
  set(app ${WORK_DIR}/no_cuda/bin/resnet18_cifar)
  set(expected "libloom_cuda")
  run(${gpu_run} ${app} ${small})  # the CPU run needs none of it
endif()
execute_process(COMMAND ${gpu_run} ${app} ${small} --gpus 1 WORKING_DIRECTORY ${WORK_DIR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT "${out}${err}" MATCHES "no CUDA device is visible.*${expected}")
  file(REMOVE_RECURSE ${WORK_DIR})
  message(FATAL_ERROR "--gpus 1 without a usable CUDA: expected status 2 and a message naming "
                      "'${expected}'; got ${rc}:\n${out}\n${err}")
endif()
if(LOOM_WITH_CUDA AND NOT "${out}${err}" MATCHES "libcu(darX|blaX)")
  file(REMOVE_RECURSE ${WORK_DIR})
  message(FATAL_ERROR "--gpus 1 without the CUDA runtime: the message does not name it:\n${out}\n${err}")
endif()

run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)

# The same program through pkg-config.
find_program(PKG_CONFIG pkg-config)
if(LOOM_SHARED AND PKG_CONFIG)
  file(GLOB pc_dir ${prefix}/lib*/pkgconfig)
  run(${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pc_dir} sh -c
      "c++ -O1 -o '${WORK_DIR}/consumer_pc' '${CONSUMER_SOURCE_DIR}/main.cpp' \
       $(${PKG_CONFIG} --cflags --libs loom)")
  run(${WORK_DIR}/consumer_pc)
endif()
file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "installed loom found, linked and ran")
