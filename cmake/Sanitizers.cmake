# GPULAB_SANITIZE=address,undefined instruments the host C++ code (.cpp files) with the named
# sanitizers; nvcc-compiled host code (.cu files) is left uninstrumented, which the sanitizers
# tolerate: they check every access the instrumented code makes.
# GPULAB_FUZZ=ON (clang only) adds coverage for libFuzzer to host C++ code and builds the
# targets in tests/fuzz (see docs/reliability.md).
set(GPULAB_SANITIZE "" CACHE STRING "Sanitizers for host C++ code, e.g. address,undefined")
option(GPULAB_FUZZ "Build the libFuzzer targets in tests/fuzz (needs clang)" OFF)

if(GPULAB_SANITIZE)
  # Any report fails the test that triggered it; frame pointers give whole stacks.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${GPULAB_SANITIZE};-fno-sanitize-recover=all;-fno-omit-frame-pointer>")
  add_link_options("$<$<LINK_LANGUAGE:CXX>:-fsanitize=${GPULAB_SANITIZE}>")
endif()

if(GPULAB_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "GPULAB_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>")
  add_link_options("$<$<LINK_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>")
endif()
