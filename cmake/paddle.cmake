# Find PaddlePaddle's headers and version.
#
# Either given by the caller (-DPADDLE_INCLUDE_DIR=... -DPADDLE_VERSION=..., what
# setup.py passes when it read the header out of the paddlepaddle wheel without
# installing it), or looked up from the wheel installed for the Python interpreter
# that runs the build (never from a source tree).
#
# Sets PADDLE_INCLUDE_DIR, PADDLE_LIB_DIR and PADDLE_VERSION. The plugin needs one
# header, paddle/phi/backends/device_ext.h, and links nothing of Paddle's; the ipu
# kernels (csrc/kernels) need Paddle's C++ headers and link its libphi_core and
# libcommon (from PADDLE_LIB_DIR, the wheel's paddle/libs).

if(NOT PADDLE_INCLUDE_DIR OR NOT PADDLE_VERSION)
  if(NOT Python_EXECUTABLE)
    find_package(Python COMPONENTS Interpreter REQUIRED)
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import os, importlib.metadata as m, importlib.util as u; s = u.find_spec('paddle'); d = os.path.dirname(os.path.realpath(s.origin)); print(d); print(m.version('paddlepaddle'))"
    OUTPUT_VARIABLE _paddle_out
    RESULT_VARIABLE _paddle_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _paddle_rc EQUAL 0)
    message(FATAL_ERROR
      "paddle-ipu needs PaddlePaddle's headers: install paddlepaddle for ${Python_EXECUTABLE} "
      "(pip install 'paddlepaddle>=3.0,<3.4') or pass -DPADDLE_INCLUDE_DIR and -DPADDLE_VERSION.")
  endif()
  string(REPLACE "\n" ";" _paddle_lines "${_paddle_out}")
  list(GET _paddle_lines 0 _paddle_root)
  list(GET _paddle_lines 1 PADDLE_VERSION)
  set(PADDLE_INCLUDE_DIR "${_paddle_root}/include")
  if(NOT PADDLE_LIB_DIR)
    set(PADDLE_LIB_DIR "${_paddle_root}/libs")
  endif()
endif()

if(NOT EXISTS "${PADDLE_INCLUDE_DIR}/paddle/phi/backends/device_ext.h")
  message(FATAL_ERROR
    "PaddlePaddle ${PADDLE_VERSION}: ${PADDLE_INCLUDE_DIR} has no "
    "paddle/phi/backends/device_ext.h: a wheel with custom-device support is needed.")
endif()

foreach(_lib libphi_core.so libcommon.so)
  if(NOT PADDLE_LIB_DIR OR NOT EXISTS "${PADDLE_LIB_DIR}/${_lib}")
    message(FATAL_ERROR
      "PaddlePaddle ${PADDLE_VERSION}: no ${_lib} in '${PADDLE_LIB_DIR}' (pass "
      "-DPADDLE_LIB_DIR=<site-packages>/paddle/libs): the ipu kernels link it.")
  endif()
endforeach()

message(STATUS "PaddlePaddle ${PADDLE_VERSION}: headers in ${PADDLE_INCLUDE_DIR}, libraries in ${PADDLE_LIB_DIR}")

# The release the C++ parts are built against, for the sources: PADDLE_IPU_PADDLE_VERSION
# ("3.2.2"), PADDLE_IPU_PADDLE_SERIES ("3.2") and PADDLE_IPU_PADDLE_MINOR (302: 100 x
# major + minor, for `#if`). The plugin names them when it refuses another release; the
# kernels leave out what an older release's headers do not declare.
string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" PADDLE_SERIES "${PADDLE_VERSION}")
if(NOT PADDLE_SERIES)
  message(FATAL_ERROR "PaddlePaddle version '${PADDLE_VERSION}' is not of the form MAJOR.MINOR.PATCH")
endif()
math(EXPR PADDLE_MINOR_NUMBER "${CMAKE_MATCH_1} * 100 + ${CMAKE_MATCH_2}")

function(paddle_ipu_release_definitions target)
  target_compile_definitions(${target} PRIVATE
    PADDLE_IPU_PADDLE_VERSION="${PADDLE_VERSION}"
    PADDLE_IPU_PADDLE_SERIES="${PADDLE_SERIES}"
    PADDLE_IPU_PADDLE_MINOR=${PADDLE_MINOR_NUMBER})
endfunction()
