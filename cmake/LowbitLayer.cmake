# lowbit_layer(NAME [DIR subdir] [SUBDIRS folder...] DEPS ...): a static library from src/<DIR>/*.cpp and
# src/<DIR>/<folder>/*.cpp for each of SUBDIRS (the model layer's family/ folder, one file per model family).
# Sources are globbed so that adding a file to a layer never means editing CMake.
# A layer's private include root is its own folder (src/<DIR>), so it includes its private headers relative to
# that folder ("json_fields.h", "family/llama.h") and cannot name another layer's: src/ itself is on no include
# path. Public headers come from include/; cmake/CheckLayering.cmake refuses those of a higher layer.
function(lowbit_layer name)
  cmake_parse_arguments(L "" "DIR" "DEPS;SUBDIRS" ${ARGN})
  if(NOT L_DIR)
    set(L_DIR ${name})
  endif()
  set(patterns ${CMAKE_SOURCE_DIR}/src/${L_DIR}/*.cpp)
  foreach(sub IN LISTS L_SUBDIRS)
    list(APPEND patterns ${CMAKE_SOURCE_DIR}/src/${L_DIR}/${sub}/*.cpp)
  endforeach()
  file(GLOB sources CONFIGURE_DEPENDS ${patterns})
  if(NOT sources)
    # A layer with no sources yet still forwards its dependencies to the layers above it.
    add_library(lowbit_${name} INTERFACE)
    target_include_directories(lowbit_${name} INTERFACE ${CMAKE_SOURCE_DIR}/include)
    target_link_libraries(lowbit_${name} INTERFACE ${L_DEPS})
    return()
  endif()
  add_library(lowbit_${name} STATIC ${sources})
  target_include_directories(lowbit_${name} PUBLIC ${CMAKE_SOURCE_DIR}/include PRIVATE ${CMAKE_SOURCE_DIR}/src/${L_DIR})
  target_link_libraries(lowbit_${name} PUBLIC ${L_DEPS})
  target_compile_definitions(lowbit_${name} PUBLIC LOWBIT_VERSION="${PROJECT_VERSION}")
  add_dependencies(lowbit_${name} lowbit_layering)
endfunction()

# lowbit_test_suite(NAME [USES_CLI] [SRC dir] LIBS ...): one GoogleTest binary per folder of tests/. USES_CLI
# builds the lowbit binary first, for tests that run it (its path is LOWBIT_CLI). The suite sees the private
# headers of the layer it tests (src/<SRC>, default src/<NAME>) and the shared test helpers under tests/.
function(lowbit_test_suite name)
  cmake_parse_arguments(T "USES_CLI" "SRC" "LIBS" ${ARGN})
  if(NOT T_SRC)
    set(T_SRC ${name})
  endif()
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${name}/*.cpp)
  if(NOT sources)
    return()
  endif()
  add_executable(test_${name} ${sources})
  target_link_libraries(test_${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_include_directories(test_${name} PRIVATE ${CMAKE_SOURCE_DIR}/src/${T_SRC} ${CMAKE_SOURCE_DIR}/tests)
  target_compile_definitions(test_${name} PRIVATE
    LOWBIT_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    LOWBIT_SHARED_DIR="${CMAKE_SOURCE_DIR}/../shared"
    LOWBIT_CLI="$<TARGET_FILE:lowbit>")
  if(T_USES_CLI)
    add_dependencies(test_${name} lowbit)
  endif()
  gtest_discover_tests(test_${name} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS ${name})
endfunction()
