# Install rules (included last by the root CMakeLists.txt).
#
#   FLASHCORE_PYTHON_WHEEL=ON (pyproject.toml): flashcore/lib/libflashcore.so (which then also holds the CLI's
#     commands) and flashcore/bin/flashcore, main() linked to it with the rpath $ORIGIN/../lib (the console script,
#     python -m flashcore and flashcore.tune() run it; tools/CMakeLists.txt), component "python".
#   FLASHCORE_INSTALL=ON (default when top level):
#     <includedir>/flashcore/flashcore.h, flashcore.hpp, ring.h
#     <libdir>/libflashcore.so (+ .so.<major>, .so.<version> links), libflashcore_static.a
#     <libdir>/cmake/flashcore/flashcoreConfig.cmake, flashcoreConfigVersion.cmake, flashcoreTargets*.cmake
#       -> find_package(flashcore) gives flashcore::flashcore (shared) and flashcore::static
#     <libdir>/pkgconfig/flashcore.pc
#     <bindir>/flashcore (the CLI, when built), <datadir>/doc/flashcore/LICENSE
if(FLASHCORE_PYTHON_WHEEL)
  install(TARGETS flashcore_shared LIBRARY DESTINATION flashcore/lib COMPONENT python)
  if(TARGET flashcore)
    install(TARGETS flashcore RUNTIME DESTINATION flashcore/bin COMPONENT python)
  endif()
  return()
endif()
if(NOT FLASHCORE_INSTALL)
  return()
endif()

include(CMakePackageConfigHelpers)
set(FLASHCORE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashcore CACHE STRING
    "Where flashcoreConfig.cmake is installed (relative to the prefix)")
mark_as_advanced(FLASHCORE_INSTALL_CMAKEDIR)

install(FILES ${PROJECT_SOURCE_DIR}/include/flashcore/flashcore.h ${PROJECT_SOURCE_DIR}/include/flashcore/flashcore.hpp ${PROJECT_SOURCE_DIR}/include/flashcore/ring.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flashcore COMPONENT dev)
install(TARGETS flashcore_shared EXPORT flashcoreTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(TARGETS flashcore_static EXPORT flashcoreTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(EXPORT flashcoreTargets NAMESPACE flashcore:: DESTINATION ${FLASHCORE_INSTALL_CMAKEDIR} COMPONENT dev)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/flashcoreConfig.cmake.in
  ${PROJECT_BINARY_DIR}/flashcoreConfig.cmake INSTALL_DESTINATION ${FLASHCORE_INSTALL_CMAKEDIR})
# 0.x minors keep old callers working (see the soname): any 0.y >= the requested version is accepted.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flashcoreConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flashcoreConfig.cmake ${PROJECT_BINARY_DIR}/flashcoreConfigVersion.cmake
        DESTINATION ${FLASHCORE_INSTALL_CMAKEDIR} COMPONENT dev)

# pkg-config: prefix relative to the .pc file, so `cmake --install --prefix X` relocates it.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(FLASHCORE_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(FLASHCORE_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH _fc_up /_fc/${CMAKE_INSTALL_LIBDIR}/pkgconfig /_fc)  # "../.." (or deeper)
  string(REGEX REPLACE "/$" "" _fc_up "${_fc_up}")
  set(FLASHCORE_PC_PREFIX "\${pcfiledir}/${_fc_up}")
  set(FLASHCORE_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(FLASHCORE_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(FLASHCORE_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
# The CUDA toolkit's headers and runtime for the caller's own CUDA calls (absolute: the toolkit of this build).
list(GET CUDAToolkit_INCLUDE_DIRS 0 FLASHCORE_PC_CUDA_INCLUDEDIR)
set(FLASHCORE_PC_CUDA_LIBDIR "${CUDAToolkit_LIBRARY_DIR}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/flashcore.pc.in ${PROJECT_BINARY_DIR}/flashcore.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/flashcore.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

if(TARGET flashcore)  # the CLI (tools/)
  install(TARGETS flashcore RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
endif()
if(EXISTS ${PROJECT_SOURCE_DIR}/LICENSE)
  install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/flashcore COMPONENT runtime)
endif()
