# Find PaddlePaddle's headers and version from the wheel installed for the
# Python interpreter that runs the build (never from a source tree).
#
# Sets PADDLE_INCLUDE_DIR, PADDLE_LIB_DIR and PADDLE_VERSION.

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
    "paddle-ipu needs PaddlePaddle installed for ${Python_EXECUTABLE} "
    "(pip install 'paddlepaddle==3.3.*'); looking it up failed.")
endif()

string(REPLACE "\n" ";" _paddle_lines "${_paddle_out}")
list(GET _paddle_lines 0 PADDLE_ROOT)
list(GET _paddle_lines 1 PADDLE_VERSION)
set(PADDLE_INCLUDE_DIR "${PADDLE_ROOT}/include")
set(PADDLE_LIB_DIR "${PADDLE_ROOT}/base")

if(NOT EXISTS "${PADDLE_INCLUDE_DIR}/paddle/phi/backends/device_ext.h")
  message(FATAL_ERROR
    "PaddlePaddle ${PADDLE_VERSION} at ${PADDLE_ROOT} ships no "
    "paddle/phi/backends/device_ext.h: a wheel with custom-device support is needed.")
endif()

message(STATUS "PaddlePaddle ${PADDLE_VERSION}: ${PADDLE_ROOT}")
