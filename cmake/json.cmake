# nlohmann/json (header only), for reading and writing tuning tables (src/api/tuning.cpp). Defines the INTERFACE
# target flashcore_json: the installed package (>= 3.10; Debian/Ubuntu: nlohmann-json3-dev, which
# tools/setup_deps.sh installs), else the pinned 3.11.3 release, downloaded at configure time. Only the headers
# of the download are used (its CMakeLists.txt is not run), so nothing of it is built or installed.
if(TARGET flashcore_json)
  return()
endif()
if(NOT TARGET nlohmann_json::nlohmann_json)
  find_package(nlohmann_json 3.10 QUIET)
endif()
add_library(flashcore_json INTERFACE)
if(TARGET nlohmann_json::nlohmann_json)
  target_link_libraries(flashcore_json INTERFACE nlohmann_json::nlohmann_json)
  message(STATUS "nlohmann/json: found ${nlohmann_json_VERSION} (${nlohmann_json_DIR})")
else()
  include(FetchContent)
  FetchContent_Declare(flashcore_nlohmann_json
    URL https://github.com/nlohmann/json/releases/download/v3.11.3/json.tar.xz
    URL_HASH SHA256=d6c65aca6b1ed68e7a182f4757257b107ae403032760ed6ef121c9d55e81757d
    DOWNLOAD_EXTRACT_TIMESTAMP TRUE
    # A folder without a CMakeLists.txt: FetchContent_MakeAvailable populates the sources and adds nothing.
    SOURCE_SUBDIR include)
  FetchContent_MakeAvailable(flashcore_nlohmann_json)
  if(NOT EXISTS ${flashcore_nlohmann_json_SOURCE_DIR}/include/nlohmann/json.hpp)
    message(FATAL_ERROR "nlohmann/json: the download has no include/nlohmann/json.hpp; install nlohmann-json3-dev "
                        "(tools/setup_deps.sh) or point nlohmann_json_DIR at an installed copy")
  endif()
  target_include_directories(flashcore_json SYSTEM INTERFACE ${flashcore_nlohmann_json_SOURCE_DIR}/include)
  message(STATUS "nlohmann/json: not installed; using the 3.11.3 release (${flashcore_nlohmann_json_SOURCE_DIR})")
endif()
