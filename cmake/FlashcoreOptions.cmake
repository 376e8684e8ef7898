# User-facing build options (see README.md, "Build options").
set(FLASHCORE_HEAD_DIMS "64;128;256" CACHE STRING "Head dims to compile kernels for (subset of 64;128;256)")
set(FLASHCORE_DTYPES "fp16;bf16" CACHE STRING "Dtypes to compile kernels for (subset of fp16;bf16)")
set(FLASHCORE_CUDA_ARCHS "90a" CACHE STRING "CUDA archs to generate SASS for (-gencode=arch=compute_X,code=sm_X)")
option(FLASHCORE_PTXAS_VERBOSE "Pass -Xptxas=-v so the build log carries register/spill reports" ON)
option(FLASHCORE_WERROR "Treat warnings as errors (C++: -Wall -Wextra -Werror; CUDA: -Werror=all-warnings)" OFF)
option(FLASHCORE_BUILD_TESTS "Build the GoogleTest suites (needs GTest)" ON)
option(FLASHCORE_BUILD_TOOLS "Build tools/ (the flashcore CLI)" ON)

foreach(_fc_list FLASHCORE_HEAD_DIMS FLASHCORE_DTYPES FLASHCORE_CUDA_ARCHS)
  if("${${_fc_list}}" STREQUAL "")
    message(FATAL_ERROR "${_fc_list} must not be empty")
  endif()
endforeach()
