# User-facing build options (see README.md, "Build options").
set(FLASHCORE_HEAD_DIMS "64;96;128;192;256" CACHE STRING "Head dims to compile kernels for (subset of 64;96;128;192;256)")
set(FLASHCORE_DTYPES "fp16;bf16;e4m3;e5m2;i8" CACHE STRING "Dtypes to compile kernels for (subset of fp16;bf16;e4m3;e5m2;i8; e4m3, e5m2 and i8 (int8 Q K^T, precision = INT8): sm90 only)")
set(FLASHCORE_CUDA_ARCHS "90a" CACHE STRING "CUDA archs to generate SASS of the sm90 (Hopper) kernels for (-gencode=arch=compute_X,code=sm_X)")
# Build tiers: OFF compiles the kernel rows dispatch can pick (each configs.txt row marked default, packed or
# dispatch, and the rows the shipped tuning tables choose); ON also every tuning option ("-" rows), for tuning runs.
option(FLASHCORE_ALL_CONFIGS "Compile every row of the configs*.txt tables, not only the ones dispatch picks" OFF)
option(FLASHCORE_BUILD_SM80 "Build the portable backend (mma.sync + cp.async) for compute capability 8.x" ON)
set(FLASHCORE_SM80_ARCHS "80;86;89;90" CACHE STRING
    "Archs to generate SASS of the portable kernels for (plain archs >= 80; 90: FLASHCORE_BACKEND=sm80 on Hopper)")
option(FLASHCORE_SM80_PTX "Also embed PTX of the newest FLASHCORE_SM80_ARCHS arch in the portable kernels: GPUs newer than every SASS target (compute capability 10.x, 12.x) JIT-compile it" ON)
option(FLASHCORE_PTXAS_VERBOSE "Pass -Xptxas=-v so the build log carries register/spill reports" ON)
option(FLASHCORE_WERROR "Treat warnings as errors (C++: -Wall -Wextra -Werror; CUDA: -Werror=all-warnings)" OFF)
# Tests and the CLI default to on only when FlashCore is the top-level project (not under add_subdirectory or
# FetchContent); so does installing.
option(FLASHCORE_BUILD_TESTS "Build the GoogleTest suites (needs GTest)" ${PROJECT_IS_TOP_LEVEL})
option(FLASHCORE_BUILD_TOOLS "Build tools/ (the flashcore CLI)" ${PROJECT_IS_TOP_LEVEL})
option(FLASHCORE_INSTALL "Add install rules (headers, libraries, CMake package, pkg-config)" ${PROJECT_IS_TOP_LEVEL})
# Set by pyproject.toml (scikit-build-core): install only libflashcore.so, unversioned, to flashcore/lib/.
option(FLASHCORE_PYTHON_WHEEL "Build for the Python wheel (one unversioned libflashcore.so in flashcore/lib)" OFF)

foreach(_fc_list FLASHCORE_HEAD_DIMS FLASHCORE_DTYPES FLASHCORE_CUDA_ARCHS)
  if("${${_fc_list}}" STREQUAL "")
    message(FATAL_ERROR "${_fc_list} must not be empty")
  endif()
endforeach()
if(FLASHCORE_BUILD_SM80 AND "${FLASHCORE_SM80_ARCHS}" STREQUAL "")
  message(FATAL_ERROR "FLASHCORE_SM80_ARCHS must not be empty when FLASHCORE_BUILD_SM80 is ON")
endif()
