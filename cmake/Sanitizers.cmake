# GPULAB_SANITIZE=address,undefined instruments the host C++ code (.cpp files) with the named
# sanitizers; nvcc-compiled host code (.cu files) is left uninstrumented, which the sanitizers
# tolerate: they check every access the instrumented code makes.
# GPULAB_FUZZ=ON (clang only) adds coverage for libFuzzer to host C++ code and builds the
# targets in tests/fuzz (see docs/reliability.md).
# GPULAB_SOURCE_COVERAGE=ON (clang only) adds source-based coverage to host C++ code, for
# scripts/fuzz_coverage.sh's report of what the fuzz corpora reach.
set(GPULAB_SANITIZE "" CACHE STRING "Sanitizers for host C++ code, e.g. address,undefined")
option(GPULAB_FUZZ "Build the libFuzzer targets in tests/fuzz (needs clang)" OFF)
option(GPULAB_SOURCE_COVERAGE "Source-based coverage of host C++ code (needs clang)" OFF)

if(GPULAB_SANITIZE)
  # Any report fails the test that triggered it; frame pointers give whole stacks.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${GPULAB_SANITIZE};-fno-sanitize-recover=all;-fno-omit-frame-pointer>")
  add_link_options("$<$<LINK_LANGUAGE:CXX>:-fsanitize=${GPULAB_SANITIZE}>")
endif()

if((GPULAB_FUZZ OR GPULAB_SOURCE_COVERAGE) AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "GPULAB_FUZZ and GPULAB_SOURCE_COVERAGE need clang: configure with -DCMAKE_CXX_COMPILER=clang++")
endif()

if(GPULAB_FUZZ)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>")
  add_link_options("$<$<LINK_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>")
endif()

if(GPULAB_SOURCE_COVERAGE)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fprofile-instr-generate;-fcoverage-mapping>")
  add_link_options("$<$<LINK_LANGUAGE:CXX>:-fprofile-instr-generate>")
endif()
