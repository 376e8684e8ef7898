# flashcore_warnings(<target>): warning flags for FlashCore's own targets; errors when FLASHCORE_WERROR.
function(flashcore_warnings target)
  if(MSVC)
    return()
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra>)
  if(FLASHCORE_WERROR)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings;-Xcompiler=-Wall,-Wextra,-Werror>)
  endif()
endfunction()
