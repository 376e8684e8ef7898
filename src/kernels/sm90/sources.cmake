# sm90 kernels: one generated translation unit per (dtype, O dtype, row of configs*.txt) of the build tier. 16-bit rows
# come from configs.txt; 8-bit (e4m3, e5m2 in FLASHCORE_DTYPES) rows from configs_fp8.txt and int8 Q K^T rows (i8,
# precision = INT8) from configs_i8.txt, each compiled with O (and for int8, V) in bf16 and in fp16; e4m3 KV-cache rows
# under each 16-bit dtype (FLASHCORE_FLAG_KV_FP8_E4M3) from configs_kv8.txt.
# The units are written by gen_rows.cpp (a host program built here with try_compile and run at configure time), whose
# names, shapes and unit text come from config_grammar.h, the grammar runtime variants use too (variant.cpp).
# Inputs : FLASHCORE_HEAD_DIMS (e.g. "64;128;256"), FLASHCORE_DTYPES (e.g. "fp16;bf16;e4m3"), FLASHCORE_ALL_CONFIGS,
#          src/api/tuned/*.json (the configs the shipped tuning tables choose).
# Outputs: FLASHCORE_SM90_SOURCES (.cu/.cpp files), FLASHCORE_GENERATED_INCLUDE_DIR (holds kernels/sm90/rows.inc:
#          one FLASHCORE_SM90_ROW(symbol) line per compiled kernel, the list backend.cpp reads, and packed_rows.inc).
set(_fc_sm90_dir ${CMAKE_CURRENT_LIST_DIR})
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_fc_sm90_dir}/configs.txt ${_fc_sm90_dir}/configs_fp8.txt
             ${_fc_sm90_dir}/configs_i8.txt ${_fc_sm90_dir}/configs_kv8.txt ${_fc_sm90_dir}/gen_rows.cpp ${_fc_sm90_dir}/config_grammar.h
             ${_fc_sm90_dir}/tile_shape.h)

# Write a generated file only when its content changes, so a re-configure rebuilds nothing.
function(_fc_write_if_changed path content)
  set(old "")
  if(EXISTS ${path})
    file(READ ${path} old)
  endif()
  if(NOT old STREQUAL content)
    file(WRITE ${path} "${content}")
  endif()
endfunction()

# dtype name -> C++ element type and C ABI enum, for the portable backend's generator (src/kernels/sm80/sources.cmake;
# gen_rows.cpp has the sm90 table).
set(_fc_elem_fp16 "__half")
set(_fc_enum_fp16 "FLASHCORE_DTYPE_FP16")
set(_fc_elem_bf16 "__nv_bfloat16")
set(_fc_enum_bf16 "FLASHCORE_DTYPE_BF16")

set(_fc_gen_dir ${PROJECT_BINARY_DIR}/generated/kernels/sm90)
file(MAKE_DIRECTORY ${_fc_gen_dir})
set(FLASHCORE_GENERATED_INCLUDE_DIR ${PROJECT_BINARY_DIR}/generated)
set(FLASHCORE_SM90_SOURCES ${_fc_sm90_dir}/backend.cpp ${_fc_sm90_dir}/launch.cpp ${_fc_sm90_dir}/precision.cpp
                           ${_fc_sm90_dir}/tma_desc.cpp ${_fc_sm90_dir}/variant.cpp
                           ${_fc_sm90_dir}/variant_registry.cpp ${_fc_sm90_dir}/combine.cu
                           ${_fc_sm90_dir}/fp8_prep.cu ${_fc_sm90_dir}/int8_prep.cu)

# Build tiers: a row whose choice column is "-" (a tuning option) is compiled only when FLASHCORE_ALL_CONFIGS is ON or
# when a shipped tuning table (src/api/tuned/*.json) chooses it for a bucket of its (dtype, head dim, mask): the
# default build holds the rows dispatch can pick (docs/decisions.md#build-tiers); the others are a
# `flashcore tune --build` away (docs/tuning.md). The tables' choices go to the generator as opaque keys.
set(_fc_tuned_keys "")
file(GLOB _fc_tuned_jsons ${PROJECT_SOURCE_DIR}/src/api/tuned/*.json)
foreach(_fc_json IN LISTS _fc_tuned_jsons)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_fc_json})
  file(READ ${_fc_json} _fc_text)
  string(JSON _fc_n ERROR_VARIABLE _fc_err LENGTH "${_fc_text}" entries)
  if(_fc_err)
    message(FATAL_ERROR "${_fc_json}: no entries array (${_fc_err})")
  endif()
  if(_fc_n GREATER 0)
    math(EXPR _fc_last "${_fc_n} - 1")
    foreach(_i RANGE ${_fc_last})
      string(JSON _e GET "${_fc_text}" entries ${_i})
      string(JSON _edt GET "${_e}" dtype)
      string(JSON _ehd GET "${_e}" head_dim)
      string(JSON _ec GET "${_e}" causal)
      string(JSON _ecfg GET "${_e}" config)
      set(_ecz 0)
      if(_ec STREQUAL "ON" OR _ec STREQUAL "TRUE" OR _ec STREQUAL "true")
        set(_ecz 1)
      endif()
      list(APPEND _fc_tuned_keys "${_edt}:${_ehd}:${_ecz}:${_ecfg}")
    endforeach()
  endif()
endforeach()
list(REMOVE_DUPLICATES _fc_tuned_keys)
string(REPLACE ";" "\n" _fc_tuned_text "${_fc_tuned_keys}")
_fc_write_if_changed(${_fc_gen_dir}/tuned_keys.txt "${_fc_tuned_text}\n")

# The generator: a host program of gen_rows.cpp and config_grammar.h (no CUDA), built with the C++ compiler.
try_compile(_fc_gen_built ${PROJECT_BINARY_DIR}/generated/gen_rows_build
  SOURCES ${_fc_sm90_dir}/gen_rows.cpp
  CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${PROJECT_SOURCE_DIR}/src"
  CXX_STANDARD 17
  CXX_STANDARD_REQUIRED ON
  OUTPUT_VARIABLE _fc_gen_log
  COPY_FILE ${_fc_gen_dir}/gen_rows
  COPY_FILE_ERROR _fc_gen_copy_error)
if(NOT _fc_gen_built OR _fc_gen_copy_error)
  message(FATAL_ERROR "building src/kernels/sm90/gen_rows.cpp failed: ${_fc_gen_copy_error}\n${_fc_gen_log}")
endif()
set(_fc_all_configs 0)
if(FLASHCORE_ALL_CONFIGS)
  set(_fc_all_configs 1)
endif()
execute_process(
  COMMAND ${_fc_gen_dir}/gen_rows ${_fc_gen_dir} "${FLASHCORE_DTYPES}" "${FLASHCORE_HEAD_DIMS}" ${_fc_all_configs}
          ${_fc_gen_dir}/tuned_keys.txt ${_fc_sm90_dir}/configs.txt ${_fc_sm90_dir}/configs_fp8.txt
          ${_fc_sm90_dir}/configs_i8.txt ${_fc_sm90_dir}/configs_kv8.txt
  RESULT_VARIABLE _fc_gen_rc OUTPUT_VARIABLE _fc_left_out ERROR_VARIABLE _fc_gen_err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _fc_gen_rc EQUAL 0)
  message(FATAL_ERROR "${_fc_gen_err}")
endif()
file(STRINGS ${_fc_gen_dir}/sources.txt _fc_units)
list(APPEND FLASHCORE_SM90_SOURCES ${_fc_units})
if(NOT FLASHCORE_ALL_CONFIGS)
  message(STATUS "sm90: ${_fc_left_out} tuning-option rows left out (FLASHCORE_ALL_CONFIGS=ON builds them)")
endif()

# The backward (bwd_kernel.cuh): one generated unit per 16-bit dtype and (head dim, V head dim) it has -- 64, 96, 128,
# 192, (192, 128) and 256, where FLASHCORE_HEAD_DIMS holds the head dim -- each with its causal and non-causal kernels
# (and the variants' at 64, 96 and 128; at 192 and 256 with FLASHCORE_BWD_WIDE_VARIANTS, OFF: not yet run on a GPU)
# and the launches around them; bwd_rows.inc lists them for bwd_launch.cpp.
if(FLASHCORE_BWD_WIDE_VARIANTS)
  set(_fc_wide_variants 1)
else()
  set(_fc_wide_variants 0)
endif()
list(APPEND FLASHCORE_SM90_SOURCES ${_fc_sm90_dir}/bwd_launch.cpp)
set(_fc_bwd_rows "// Generated by src/kernels/sm90/sources.cmake: do not edit.\n")
foreach(_fc_dt IN ITEMS bf16 fp16)
  if(NOT _fc_dt IN_LIST FLASHCORE_DTYPES)
    continue()
  endif()
  foreach(_fc_pair IN ITEMS 64 96 128 192 192/128 256)
    string(REPLACE "/" ";" _fc_hds "${_fc_pair}")
    list(GET _fc_hds 0 _fc_hd)
    list(GET _fc_hds -1 _fc_hdv)
    if(NOT _fc_hd IN_LIST FLASHCORE_HEAD_DIMS)
      continue()
    endif()
    set(_fc_name ${_fc_dt}_${_fc_hd})
    if(NOT _fc_hdv EQUAL _fc_hd)
      set(_fc_name ${_fc_name}v${_fc_hdv})
    endif()
    set(_fc_unit ${_fc_gen_dir}/bwd_${_fc_name}.cu)
    _fc_write_if_changed(${_fc_unit} "// Generated by src/kernels/sm90/sources.cmake: do not edit.
#include \"kernels/sm90/bwd_kernel.cuh\"
FLASHCORE_SM90_DEFINE_BWD(${_fc_name}, ${_fc_elem_${_fc_dt}}, ${_fc_enum_${_fc_dt}}, ${_fc_hd}, ${_fc_hdv}, ${_fc_wide_variants})
")
    list(APPEND FLASHCORE_SM90_SOURCES ${_fc_unit})
    string(APPEND _fc_bwd_rows "FLASHCORE_SM90_BWD(${_fc_name})\n")
  endforeach()
endforeach()
_fc_write_if_changed(${_fc_gen_dir}/bwd_rows.inc "${_fc_bwd_rows}")
