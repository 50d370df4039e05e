# Find nghttp2 (the HTTP/2 library under the native gRPC front end,
# csrc/serving/grpc_connection.cc): its header and shared library.
#
# Sets PADDLE_IPU_NGHTTP2_INCLUDE and PADDLE_IPU_NGHTTP2_LIBRARY (either may be given
# by the caller with -D...). Debian / Ubuntu: apt-get install libnghttp2-dev.

set(PADDLE_IPU_NGHTTP2_MIN 1.40)
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND AND NOT PADDLE_IPU_NGHTTP2_INCLUDE)
  pkg_check_modules(_nghttp2 QUIET libnghttp2>=${PADDLE_IPU_NGHTTP2_MIN})
endif()
find_path(PADDLE_IPU_NGHTTP2_INCLUDE nghttp2/nghttp2.h HINTS ${_nghttp2_INCLUDE_DIRS})
find_library(PADDLE_IPU_NGHTTP2_LIBRARY NAMES nghttp2 HINTS ${_nghttp2_LIBRARY_DIRS})
if(NOT PADDLE_IPU_NGHTTP2_INCLUDE OR NOT PADDLE_IPU_NGHTTP2_LIBRARY)
  message(FATAL_ERROR
    "nghttp2 (>= ${PADDLE_IPU_NGHTTP2_MIN}) was not found: the native gRPC front end needs "
    "its header (nghttp2/nghttp2.h) and library. Install it (Debian / Ubuntu: "
    "apt-get install libnghttp2-dev), or pass -DPADDLE_IPU_NGHTTP2_INCLUDE=... and "
    "-DPADDLE_IPU_NGHTTP2_LIBRARY=...")
endif()
file(STRINGS "${PADDLE_IPU_NGHTTP2_INCLUDE}/nghttp2/nghttp2ver.h" _nghttp2_ver
     REGEX "#define NGHTTP2_VERSION \"")
string(REGEX REPLACE ".*\"([0-9.]+).*" "\\1" PADDLE_IPU_NGHTTP2_VERSION "${_nghttp2_ver}")
if(PADDLE_IPU_NGHTTP2_VERSION VERSION_LESS PADDLE_IPU_NGHTTP2_MIN)
  message(FATAL_ERROR
    "nghttp2 ${PADDLE_IPU_NGHTTP2_VERSION} is older than ${PADDLE_IPU_NGHTTP2_MIN} "
    "(apt-get install libnghttp2-dev on a newer distribution)")
endif()
message(STATUS "nghttp2 ${PADDLE_IPU_NGHTTP2_VERSION}: ${PADDLE_IPU_NGHTTP2_LIBRARY}")
