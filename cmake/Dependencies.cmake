# Finds every third-party dependency once; modules link the imported targets named here.
# Required ones stop configuration with a message naming the package to install.

find_package(CUDAToolkit 12.0 REQUIRED)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)

# Libraries that ship with the toolkit but not as CUDAToolkit components. -D<var>_ROOT=DIR adds
# DIR/lib and DIR/include (e.g. an unpacked pip wheel); extra arguments are extra library names.
function(gpulab_find_toolkit_lib var libname header)
  find_library(${var}_LIB NAMES ${libname} ${ARGN}
    HINTS ${${var}_ROOT}/lib ${${var}_ROOT}/lib64 ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64
          ${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/lib64 /usr/lib/x86_64-linux-gnu)
  find_path(${var}_INCLUDE NAMES ${header}
    HINTS ${${var}_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/include /usr/include)
  if(${var}_LIB AND ${var}_INCLUDE)
    set(${var}_FOUND TRUE PARENT_SCOPE)
    set(tgt gpulab::${libname})
    add_library(${tgt} UNKNOWN IMPORTED GLOBAL)
    set_target_properties(${tgt} PROPERTIES IMPORTED_LOCATION ${${var}_LIB}
      INTERFACE_INCLUDE_DIRECTORIES ${${var}_INCLUDE})
  else()
    set(${var}_FOUND FALSE PARENT_SCOPE)
  endif()
endfunction()

gpulab_find_toolkit_lib(GPULAB_CUDNN cudnn cudnn.h)
gpulab_find_toolkit_lib(GPULAB_NCCL nccl nccl.h)
gpulab_find_toolkit_lib(GPULAB_CUPTI cupti cupti.h)
# The nvidia-nvjpeg wheel ships only the versioned name (lib/libnvjpeg.so.13).
gpulab_find_toolkit_lib(GPULAB_NVJPEG nvjpeg nvjpeg.h libnvjpeg.so.13)
gpulab_find_toolkit_lib(GPULAB_CUSPARSELT cusparseLt cusparseLt.h)

foreach(req CUDNN NCCL CUPTI)
  if(NOT GPULAB_${req}_FOUND)
    message(FATAL_ERROR "gpulab needs ${req} from the CUDA toolkit; install it (e.g. the cudnn9-cuda-13 / libnccl-dev packages) or point CMAKE_PREFIX_PATH at it")
  endif()
  set(GPULAB_${req}_SUMMARY "found (${GPULAB_${req}_LIB})")
endforeach()
foreach(opt NVJPEG CUSPARSELT)
  if(GPULAB_${opt}_FOUND)
    set(GPULAB_${opt}_SUMMARY "found (${GPULAB_${opt}_LIB})")
  else()
    set(GPULAB_${opt}_SUMMARY "not found: features that need it are built without it")
  endif()
endforeach()
set(GPULAB_HAVE_NVJPEG ${GPULAB_NVJPEG_FOUND})
set(GPULAB_HAVE_CUSPARSELT ${GPULAB_CUSPARSELT_FOUND})

if(GPULAB_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

# PCRE2 (8-bit, UTF + Unicode properties) for tokenizer pre-splitting regexes.
find_path(GPULAB_PCRE2_INCLUDE pcre2.h)
find_library(GPULAB_PCRE2_LIB pcre2-8)
if(NOT GPULAB_PCRE2_INCLUDE OR NOT GPULAB_PCRE2_LIB)
  message(FATAL_ERROR "gpulab needs PCRE2: apt-get install libpcre2-dev")
endif()
add_library(gpulab::pcre2 UNKNOWN IMPORTED GLOBAL)
set_target_properties(gpulab::pcre2 PROPERTIES IMPORTED_LOCATION ${GPULAB_PCRE2_LIB}
  INTERFACE_INCLUDE_DIRECTORIES ${GPULAB_PCRE2_INCLUDE}
  INTERFACE_COMPILE_DEFINITIONS PCRE2_CODE_UNIT_WIDTH=8)

# libjpeg-turbo through its TurboJPEG API: JPEG decode/encode for the CPU image pipeline.
find_path(GPULAB_TURBOJPEG_INCLUDE turbojpeg.h)
find_library(GPULAB_TURBOJPEG_LIB turbojpeg)
if(NOT GPULAB_TURBOJPEG_INCLUDE OR NOT GPULAB_TURBOJPEG_LIB)
  message(FATAL_ERROR "gpulab needs libjpeg-turbo (TurboJPEG API): apt-get install libturbojpeg0-dev")
endif()
add_library(gpulab::turbojpeg UNKNOWN IMPORTED GLOBAL)
set_target_properties(gpulab::turbojpeg PROPERTIES IMPORTED_LOCATION ${GPULAB_TURBOJPEG_LIB}
  INTERFACE_INCLUDE_DIRECTORIES ${GPULAB_TURBOJPEG_INCLUDE})

# CMake before 3.26 does not know nvcc's C++20 flag (the GPU machine's newer CMake does).
if(CMAKE_VERSION VERSION_LESS 3.26 AND CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA" AND NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
