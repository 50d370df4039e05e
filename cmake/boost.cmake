# Find Boost's headers (Asio, Beast, JSON: header-only, nothing to link).
#
# Sets PADDLE_IPU_BOOST_INCLUDE. In order:
# 1. -DPADDLE_IPU_BOOST_INCLUDE=... given by the caller;
# 2. the boost-headers package of the build environment (a build requirement in
#    pyproject.toml, pinned, so that every wheel compiles against the same Boost);
# 3. a system Boost >= 1.75 (Beast's and JSON's interfaces used here), e.g. Debian's
#    libboost-dev, for builds without isolation in an environment without (2).

set(PADDLE_IPU_BOOST_MIN 1.75)
if(NOT PADDLE_IPU_BOOST_INCLUDE)
  if(NOT Python_EXECUTABLE)
    find_package(Python COMPONENTS Interpreter REQUIRED)
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import boost_headers; print(boost_headers.get_include())"
    OUTPUT_VARIABLE _boost_py
    RESULT_VARIABLE _boost_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_QUIET)
  if(_boost_rc EQUAL 0 AND EXISTS "${_boost_py}/boost/beast.hpp")
    set(PADDLE_IPU_BOOST_INCLUDE "${_boost_py}")
    set(_boost_from "the boost-headers package")
  else()
    find_package(Boost ${PADDLE_IPU_BOOST_MIN} CONFIG QUIET)
    if(Boost_FOUND AND Boost_INCLUDE_DIRS)
      set(PADDLE_IPU_BOOST_INCLUDE "${Boost_INCLUDE_DIRS}")
      set(_boost_from "the system's Boost ${Boost_VERSION}")
    endif()
  endif()
else()
  set(_boost_from "-DPADDLE_IPU_BOOST_INCLUDE")
endif()
if(NOT PADDLE_IPU_BOOST_INCLUDE OR NOT EXISTS "${PADDLE_IPU_BOOST_INCLUDE}/boost/beast.hpp"
   OR NOT EXISTS "${PADDLE_IPU_BOOST_INCLUDE}/boost/json/src.hpp")
  message(FATAL_ERROR
    "paddle-ipu's serving front ends need Boost's headers (Asio, Beast, JSON; >= "
    "${PADDLE_IPU_BOOST_MIN}): pip install the boost-headers package named in pyproject.toml's "
    "[build-system] requires (a build with isolation does it), install a system Boost "
    "(apt-get install libboost-dev), or pass -DPADDLE_IPU_BOOST_INCLUDE=DIR.")
endif()
# The version, read from the headers.
file(STRINGS "${PADDLE_IPU_BOOST_INCLUDE}/boost/version.hpp" _boost_line
  REGEX "^#define BOOST_VERSION [0-9]+")
string(REGEX REPLACE "^#define BOOST_VERSION ([0-9]+).*" "\\1" _boost_num "${_boost_line}")
math(EXPR _boost_major "${_boost_num} / 100000")
math(EXPR _boost_minor "${_boost_num} / 100 % 1000")
if("${_boost_major}.${_boost_minor}" VERSION_LESS PADDLE_IPU_BOOST_MIN)
  message(FATAL_ERROR "Boost ${_boost_major}.${_boost_minor} in ${PADDLE_IPU_BOOST_INCLUDE} is "
    "older than ${PADDLE_IPU_BOOST_MIN}, which the serving front ends need")
endif()
set(PADDLE_IPU_BOOST_VERSION "${_boost_major}.${_boost_minor}")
message(STATUS "Boost ${PADDLE_IPU_BOOST_VERSION} headers: ${PADDLE_IPU_BOOST_INCLUDE} (${_boost_from})")
