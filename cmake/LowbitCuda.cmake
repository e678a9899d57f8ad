# The CUDA backend (LOWBIT_CUDA=ON): lowbit_kernels_cuda from src/kernels/cuda/*.{cu,cpp}, the GPU tests
# (tests/cuda -> test_cuda, skipping without a GPU) and the GPU benchmark (bench/cuda -> bench_cuda).
# Machine code for sm_90a (Hopper: H100/H200) and sm_80 (Ampere), plus compute_90 PTX for newer GPUs.
enable_language(CUDA)
find_package(CUDAToolkit 12 REQUIRED)

# The CUDA targets take C++20 from the project; CMake 3.25 does not yet know nvcc's flag for it.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
# A development build for the H200 alone may set -DLOWBIT_CUDA_GENCODE=-gencode=arch=compute_90a,code=sm_90a.
set(LOWBIT_CUDA_GENCODE
  -gencode=arch=compute_90a,code=sm_90a
  -gencode=arch=compute_80,code=sm_80
  -gencode=arch=compute_90,code=compute_90
  CACHE STRING "nvcc -gencode flags for the CUDA backend")

# The top level adds GCC warning flags for every language; nvcc takes them only through -Xcompiler.
function(lowbit_cuda_target target)
  get_target_property(options ${target} COMPILE_OPTIONS)
  set(wrapped)
  foreach(option IN LISTS options)
    list(APPEND wrapped "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${option}>" "$<$<COMPILE_LANGUAGE:CXX>:${option}>")
  endforeach()
  set_target_properties(${target} PROPERTIES
    COMPILE_OPTIONS "${wrapped}"
    CUDA_ARCHITECTURES OFF
    LINKER_LANGUAGE CXX)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${LOWBIT_CUDA_GENCODE} --expt-relaxed-constexpr -lineinfo>)
endfunction()

file(GLOB LOWBIT_CUDA_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_SOURCE_DIR}/src/kernels/cuda/*.cu ${CMAKE_SOURCE_DIR}/src/kernels/cuda/*.cpp)
add_library(lowbit_kernels_cuda STATIC ${LOWBIT_CUDA_SOURCES})
target_include_directories(lowbit_kernels_cuda
  PUBLIC ${CMAKE_SOURCE_DIR}/include PRIVATE ${CMAKE_SOURCE_DIR}/src/kernels/cuda)
target_link_libraries(lowbit_kernels_cuda PUBLIC lowbit_codec CUDA::cudart_static)
add_dependencies(lowbit_kernels_cuda lowbit_layering)
lowbit_cuda_target(lowbit_kernels_cuda)

# The GPU model runtime (src/model/cuda/*.cpp) joins lowbit_model, and src/model/cuda_device.cpp then offers
# --device cuda.
file(GLOB LOWBIT_CUDA_MODEL_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/model/cuda/*.cpp)
target_sources(lowbit_model PRIVATE ${LOWBIT_CUDA_MODEL_SOURCES})
target_link_libraries(lowbit_model PUBLIC lowbit_kernels_cuda)
target_compile_definitions(lowbit_model PRIVATE LOWBIT_WITH_CUDA=1)

if(LOWBIT_TESTS)
  enable_testing()
  find_package(GTest REQUIRED)
  include(GoogleTest)
  file(GLOB LOWBIT_CUDA_TESTS CONFIGURE_DEPENDS
    ${CMAKE_SOURCE_DIR}/tests/cuda/*.cu ${CMAKE_SOURCE_DIR}/tests/cuda/*.cpp)
  if(LOWBIT_CUDA_TESTS)
    add_executable(test_cuda ${LOWBIT_CUDA_TESTS})
    target_link_libraries(test_cuda PRIVATE lowbit_kernels_cuda GTest::gtest GTest::gtest_main)
    # the GPU runtime's tests against the CPU forward, on models lowbit_quant's presets wrote too
    target_link_libraries(test_cuda PRIVATE lowbit_model lowbit_quant)
    target_include_directories(test_cuda PRIVATE ${CMAKE_SOURCE_DIR}/src/kernels/cuda ${CMAKE_SOURCE_DIR}/tests)
    target_compile_definitions(test_cuda PRIVATE
      LOWBIT_SOURCE_DIR="${CMAKE_SOURCE_DIR}" LOWBIT_SHARED_DIR="${CMAKE_SOURCE_DIR}/../shared")
    lowbit_cuda_target(test_cuda)
    gtest_discover_tests(test_cuda DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60 PROPERTIES LABELS cuda)
  endif()
endif()

if(LOWBIT_BENCH)
  file(GLOB LOWBIT_CUDA_BENCH CONFIGURE_DEPENDS
    ${CMAKE_SOURCE_DIR}/bench/cuda/*.cu ${CMAKE_SOURCE_DIR}/bench/cuda/*.cpp)
  if(LOWBIT_CUDA_BENCH)
    add_executable(bench_cuda ${LOWBIT_CUDA_BENCH})
    target_link_libraries(bench_cuda PRIVATE lowbit_kernels_cuda CUDA::cublas)
    target_include_directories(bench_cuda PRIVATE ${CMAKE_SOURCE_DIR}/tests)
    lowbit_cuda_target(bench_cuda)
  endif()
endif()
