# Decide whether CUDA targets are built. AUTO enables them where a CUDA compiler is found.
include(CheckLanguage)
set(STABLEFLASH_HAVE_CUDA OFF)
# Head dims that get attention kernels (each adds forward and backward instantiations; CI builds
# them all, a quick local build may keep one).
set(STABLEFLASH_CUDA_HEAD_DIMS "64;128" CACHE STRING "Head dims with CUDA attention kernels (subset of 64;128)")
foreach(_hd IN LISTS STABLEFLASH_CUDA_HEAD_DIMS)
  if(NOT _hd MATCHES "^(64|128)$")
    message(FATAL_ERROR "STABLEFLASH_CUDA_HEAD_DIMS: '${_hd}' has no kernel; choose from 64;128")
  endif()
endforeach()
if(NOT STABLEFLASH_CUDA STREQUAL "OFF")
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES ${STABLEFLASH_CUDA_ARCHS})
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 flag yet (nvcc >= 12 has it).
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(STABLEFLASH_HAVE_CUDA ON)
  elseif(STABLEFLASH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STABLEFLASH_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
# CuTe/CUTLASS headers from the PyPI package nvidia-cutlass, installed by scripts/setup-deps.sh into
# .deps/python (never downloaded at build time). The CUDA kernels' instruction wrappers
# (attention/cuda/wgmma.cuh, tma.cuh, warp_mma.cuh) are built on them, so a CUDA build needs them.
find_path(STABLEFLASH_CUTLASS_INCLUDE_DIR cute/arch/mma_sm90_gmma.hpp
  HINTS ${PROJECT_SOURCE_DIR}/.deps/python/cutlass_library/source/include NO_DEFAULT_PATH)
set(_sf_cutlass_version "")
if(STABLEFLASH_CUTLASS_INCLUDE_DIR AND EXISTS ${STABLEFLASH_CUTLASS_INCLUDE_DIR}/cutlass/version.h)
  file(STRINGS ${STABLEFLASH_CUTLASS_INCLUDE_DIR}/cutlass/version.h _sf_v REGEX "^#define CUTLASS_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3" _sf_cutlass_version "${_sf_v}")
endif()
if(STABLEFLASH_HAVE_CUDA)
  if(NOT EXISTS "${STABLEFLASH_CUTLASS_INCLUDE_DIR}/cute/arch/mma_sm90_gmma.hpp")
    message(FATAL_ERROR "stableflash: the CUDA kernels need the CuTe/CUTLASS headers (PyPI nvidia-cutlass), not found "
                        "(STABLEFLASH_CUTLASS_INCLUDE_DIR=${STABLEFLASH_CUTLASS_INCLUDE_DIR}; looked in "
                        "${PROJECT_SOURCE_DIR}/.deps/python/cutlass_library/source/include). Run scripts/setup-deps.sh, "
                        "or pass -DSTABLEFLASH_CUTLASS_INCLUDE_DIR=<dir with cute/ and cutlass/>, or build without CUDA "
                        "(-DSTABLEFLASH_CUDA=OFF).")
  endif()
  # SYSTEM: CUTLASS's own warnings are not ours to fix.
  add_library(stableflash_cute INTERFACE)
  target_include_directories(stableflash_cute SYSTEM INTERFACE ${STABLEFLASH_CUTLASS_INCLUDE_DIR})
  add_library(stableflash::cute ALIAS stableflash_cute)
endif()
message(STATUS "stableflash: CUDA kernels ${STABLEFLASH_HAVE_CUDA} (archs: ${STABLEFLASH_CUDA_ARCHS}, head dims: "
               "${STABLEFLASH_CUDA_HEAD_DIMS}; CuTe headers ${_sf_cutlass_version}: ${STABLEFLASH_CUTLASS_INCLUDE_DIR})")
