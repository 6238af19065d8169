# Locate the torch that the build's Python interpreter imports, without find_package(Torch):
# its CMake config insists on a complete CUDA toolkit for CUDA wheels and resets
# CMAKE_CUDA_ARCHITECTURES. Defines the imported target attnlab::torch and TORCH_* variables.
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import os, torch; d = os.path.dirname(torch.__file__); print(';'.join([torch.__version__, os.path.join(d, 'include'), os.path.join(d, 'lib'), str(int(torch._C._GLIBCXX_USE_CXX11_ABI)), 'OpenMP' if 'parallel backend: OpenMP' in torch.__config__.parallel_info() else 'other', torch.version.cuda or '']))"
  OUTPUT_VARIABLE _torch_info
  OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _torch_rc)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "attnlab: cannot import torch with ${Python_EXECUTABLE}; install torch first "
                      "and build with `pip install --no-build-isolation .`")
endif()
list(GET _torch_info 0 TORCH_VERSION)
list(GET _torch_info 1 TORCH_INCLUDE_DIR)
list(GET _torch_info 2 TORCH_LIBRARY_DIR)
list(GET _torch_info 3 TORCH_CXX11_ABI)
list(GET _torch_info 4 TORCH_PARALLEL_BACKEND)  # ATen's intra-op threads: OpenMP or other
list(LENGTH _torch_info _n)
set(TORCH_CUDA_VERSION "")
if(_n GREATER 5)
  list(GET _torch_info 5 TORCH_CUDA_VERSION)
endif()
message(STATUS "attnlab: torch ${TORCH_VERSION} at ${TORCH_LIBRARY_DIR} (CUDA: '${TORCH_CUDA_VERSION}', "
               "parallel backend: ${TORCH_PARALLEL_BACKEND})")

add_library(attnlab_torch INTERFACE)
add_library(attnlab::torch ALIAS attnlab_torch)
target_include_directories(attnlab_torch SYSTEM INTERFACE
  "${TORCH_INCLUDE_DIR}" "${TORCH_INCLUDE_DIR}/torch/csrc/api/include")
target_compile_definitions(attnlab_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI})
foreach(_lib c10 torch_cpu torch)
  find_library(TORCH_${_lib}_LIBRARY ${_lib} PATHS "${TORCH_LIBRARY_DIR}" NO_DEFAULT_PATH REQUIRED)
  target_link_libraries(attnlab_torch INTERFACE "${TORCH_${_lib}_LIBRARY}")
endforeach()
