# cmake/LoomCudaLibraries.cmake — finds cuBLAS, cuBLASLt, cuDNN and NCCL, and defines the
# imported targets loom::cublas, loom::cublasLt, loom::cudnn and loom::nccl.
#
# They come either with the CUDA toolkit (this machine: /usr/local/cuda) or only as the Python
# wheels PyTorch uses (site-packages/nvidia/<lib>/{include,lib}, where the libraries carry only
# their versioned names, libcudnn.so.9). The wheels' folders are found by asking a Python that
# has them, so no path is written here. LOOM_CUDA_LIBRARY_HINTS adds folders by hand.

set(LOOM_CUDA_LIBRARY_HINTS "" CACHE STRING "Extra prefixes to search for cuDNN, NCCL and cuBLAS")

set(loom_cuda_hints ${LOOM_CUDA_LIBRARY_HINTS} ${CUDAToolkit_LIBRARY_ROOT}
    ${CUDAToolkit_TARGET_DIR})
foreach(python python3 ${LOOM_TORCH_PYTHON})
  find_program(loom_python_${python} NAMES ${python})
  if(loom_python_${python})
    execute_process(
      COMMAND ${loom_python_${python}} -c
              "import nvidia, os; print(';'.join(os.path.realpath(p) for p in nvidia.__path__))"
      OUTPUT_VARIABLE loom_nvidia_paths OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    foreach(root ${loom_nvidia_paths})
      file(GLOB loom_wheel_dirs LIST_DIRECTORIES true ${root}/*)
      list(APPEND loom_cuda_hints ${loom_wheel_dirs})
    endforeach()
  endif()
endforeach()
list(REMOVE_DUPLICATES loom_cuda_hints)

# loom_find_cuda_library(<target> <header> <library names...>)
function(loom_find_cuda_library target header)
  string(MAKE_C_IDENTIFIER ${target} id)
  find_path(LOOM_${id}_INCLUDE_DIR ${header}
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ${loom_cuda_hints} PATH_SUFFIXES include)
  # NAMES_PER_DIR: every name in a folder before the next folder, so that the wheels' versioned
  # libcudnn.so.9 wins over an unversioned libcudnn.so in a system folder searched later (the
  # header comes from the wheel too).
  find_library(LOOM_${id}_LIBRARY NAMES ${ARGN} NAMES_PER_DIR
               HINTS ${CUDAToolkit_LIBRARY_DIR} ${loom_cuda_hints}
               PATH_SUFFIXES lib lib64)
  if(NOT LOOM_${id}_INCLUDE_DIR OR NOT LOOM_${id}_LIBRARY)
    message(FATAL_ERROR "loom: ${target} not found (${header}, ${ARGN}); install it with the CUDA "
                        "toolkit or pip, or set LOOM_CUDA_LIBRARY_HINTS")
  endif()
  add_library(loom::${target} UNKNOWN IMPORTED)
  set_target_properties(loom::${target} PROPERTIES
    IMPORTED_LOCATION ${LOOM_${id}_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${LOOM_${id}_INCLUDE_DIR})
  message(STATUS "loom: ${target} ${LOOM_${id}_LIBRARY}")
endfunction()

loom_find_cuda_library(cublas cublas_v2.h cublas libcublas.so.13 libcublas.so.12)
loom_find_cuda_library(cublasLt cublasLt.h cublasLt libcublasLt.so.13 libcublasLt.so.12)
loom_find_cuda_library(cudnn cudnn.h cudnn libcudnn.so.9)
loom_find_cuda_library(nccl nccl.h nccl libnccl.so.2)
