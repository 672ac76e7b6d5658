# simdjson for the aarch64 cross build (cmake/aarch64-linux-gnu.cmake).
# Debian's libsimdjson-dev is not Multi-Arch: same, so the amd64 and arm64 -dev
# packages cannot both be installed (installing one removes the other). The
# cross build takes the headers of the installed amd64 -dev package (they are
# architecture-independent) and the arm64 shared library package libsimdjson14,
# which co-installs. This defines the target the real config file would.
set(_k3_simdjson_lib /usr/lib/aarch64-linux-gnu/libsimdjson.so.14)
if(NOT EXISTS ${_k3_simdjson_lib} OR NOT EXISTS /usr/include/simdjson.h)
  set(simdjson_FOUND FALSE)
  set(simdjson_NOT_FOUND_MESSAGE
      "needs libsimdjson14:arm64 and libsimdjson-dev (scripts/install-deps.sh)")
  return()
endif()
if(NOT TARGET simdjson::simdjson)
  add_library(simdjson::simdjson SHARED IMPORTED)
  set_target_properties(simdjson::simdjson PROPERTIES
    IMPORTED_LOCATION ${_k3_simdjson_lib}
    INTERFACE_INCLUDE_DIRECTORIES /usr/include)
endif()
set(simdjson_FOUND TRUE)
