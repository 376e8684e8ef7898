# CUDA compile flags shared by every FlashCore target that compiles .cu files.

# -gencode per requested arch of the sm90 kernels. "90a" -> -gencode=arch=compute_90a,code=sm_90a. Applied per
# source (src/CMakeLists.txt: the sm90 units get FLASHCORE_CUDA_GENCODE, the portable units
# FLASHCORE_SM80_GENCODE from src/kernels/sm80/sources.cmake), not to whole targets.
set(FLASHCORE_CUDA_GENCODE "")
foreach(_fc_arch IN LISTS FLASHCORE_CUDA_ARCHS)
  if(NOT _fc_arch MATCHES "^[0-9]+[af]?$")
    message(FATAL_ERROR "FLASHCORE_CUDA_ARCHS: bad arch '${_fc_arch}' (expected e.g. 90a or 80)")
  endif()
  list(APPEND FLASHCORE_CUDA_GENCODE "-gencode=arch=compute_${_fc_arch},code=sm_${_fc_arch}")
endforeach()

# CUDA 13 keeps the CCCL headers (<nv/target>, <cuda/std/...>, cub, thrust) under include/cccl. nvcc adds
# that directory itself; host-only C++ files that include cuda_fp16.h / cuda_bf16.h need it too.
add_library(flashcore_cuda_headers INTERFACE)
foreach(_fc_inc IN LISTS CUDAToolkit_INCLUDE_DIRS)
  if(IS_DIRECTORY ${_fc_inc}/cccl)
    target_include_directories(flashcore_cuda_headers SYSTEM INTERFACE ${_fc_inc}/cccl)
  endif()
endforeach()
target_link_libraries(flashcore_cuda_headers INTERFACE CUDA::toolkit)

# Keep a copy of each nvcc invocation's diagnostics next to its object (<object>.log), so the ptxas -v
# report of every kernel stays available after incremental builds (tools/run_tests.sh folds the reports
# of objects not rebuilt in a run into build/build.log).
if(FLASHCORE_PTXAS_VERBOSE AND NOT WIN32 AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CMAKE_CURRENT_LIST_DIR}/nvcc_log.sh)
endif()

# flashcore_cuda_options(<target>): relaxed constexpr, line info, ptxas report. The -gencode flags are set per
# source file (flashcore_cuda_gencode), since the sm90 and the portable kernels target different archs.
function(flashcore_cuda_options target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr;-lineinfo>)
  if(FLASHCORE_PTXAS_VERBOSE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
  endif()
endfunction()

# flashcore_cuda_gencode(<gencode list> <files...>): compile these .cu files (of targets in the calling
# directory) with exactly the given -gencode flags.
function(flashcore_cuda_gencode gencode)
  set(_fc_cu "")
  foreach(_fc_f IN LISTS ARGN)
    if(_fc_f MATCHES "\\.cu$")
      list(APPEND _fc_cu ${_fc_f})
    endif()
  endforeach()
  if(_fc_cu)
    set_source_files_properties(${_fc_cu} PROPERTIES COMPILE_OPTIONS "${gencode}")
  endif()
endfunction()
