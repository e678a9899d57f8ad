# cmake -DLOWBIT_SOURCE_DIR=<repo> -DWORK_DIR=<scratch> -P check_layering_test.cmake: cmake/CheckLayering.cmake
# on small trees written here, one wrong include each; every one must fail with the file and header named, and
# a tree whose includes respect the layers must pass.
cmake_minimum_required(VERSION 3.25)
set(checker ${LOWBIT_SOURCE_DIR}/cmake/CheckLayering.cmake)

# check_tree(NAME PASS|FAIL EXPECT regex FILES path content [path content ...])
function(check_tree name outcome)
  cmake_parse_arguments(C "" "EXPECT" "FILES" ${ARGN})
  set(root ${WORK_DIR}/${name})
  file(REMOVE_RECURSE ${root})
  # every layer owns a private header and a public one, so that each case adds only its wrong include
  file(WRITE ${root}/src/model/json_fields.h "#pragma once\n")
  file(WRITE ${root}/src/kernels/cuda/prepare.h "#pragma once\n")
  file(WRITE ${root}/include/lowbit/core/error.h "#pragma once\n")
  set(files ${C_FILES})
  while(files)
    list(POP_FRONT files path content)
    file(WRITE ${root}/${path} "${content}\n")
  endwhile()
  execute_process(COMMAND ${CMAKE_COMMAND} -DLOWBIT_ROOT=${root} -P ${checker}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(outcome STREQUAL "PASS" AND NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: the check refused a tree that respects the layers:\n${out}")
  elseif(outcome STREQUAL "FAIL" AND rc EQUAL 0)
    message(FATAL_ERROR "${name}: the check passed a wrong include")
  elseif(outcome STREQUAL "FAIL" AND NOT out MATCHES "${C_EXPECT}")
    message(FATAL_ERROR "${name}: expected a message matching '${C_EXPECT}', got:\n${out}")
  endif()
  message(STATUS "${name}: ${outcome} as expected")
endfunction()

check_tree(respects_layers PASS FILES
  src/model/runtime.cpp "#include \"lowbit/kernels/cuda_model_ops.h\"\n#include \"json_fields.h\"\n#include <vector>"
  include/lowbit/kernels/cuda_model_ops.h "#include <cstdint>"
  include/lowbit/model/model.h "#include \"lowbit/core/error.h\""
  src/kernels/cuda/model_ops.cu "#include \"lowbit/kernels/cuda_model_ops.h\"\n#include \"prepare.h\"")
check_tree(higher_public_header FAIL
  EXPECT "src/io/reader.cpp: includes lowbit/model/model.h of layer model \\(layer io may include io, core\\)"
  FILES src/io/reader.cpp "#include \"lowbit/model/model.h\"" include/lowbit/model/model.h "")
check_tree(sibling_public_header FAIL
  EXPECT "src/kernels/cpu/gemv.cpp: includes lowbit/kernels/cuda_model_ops.h of layer kernels_cuda"
  FILES src/kernels/cpu/gemv.cpp "#include <lowbit/kernels/cuda_model_ops.h>" include/lowbit/kernels/cuda_model_ops.h "")
check_tree(public_header_includes_higher FAIL
  EXPECT "include/lowbit/io/json.h: includes lowbit/codec/codec.h of layer codec"
  FILES include/lowbit/io/json.h "#include \"lowbit/codec/codec.h\"" include/lowbit/codec/codec.h "")
check_tree(other_layers_private_header FAIL
  EXPECT "src/model/runtime.cpp: includes \"kernels/cuda/prepare.h\", which is not in layer model's folder"
  FILES src/model/runtime.cpp "#include \"kernels/cuda/prepare.h\"")
check_tree(private_header_by_dot_dot FAIL
  EXPECT "src/model/runtime.cpp: includes \"../kernels/cuda/prepare.h\", which is not in layer model's folder"
  FILES src/model/runtime.cpp "  #  include \"../kernels/cuda/prepare.h\"")
check_tree(public_header_includes_private FAIL
  EXPECT "include/lowbit/model/config.h: public header includes \"json_fields.h\""
  FILES include/lowbit/model/config.h "#include \"json_fields.h\"")
check_tree(header_of_no_layer FAIL
  EXPECT "src/quant/gptq.cpp: includes lowbit/serve/server.h, which belongs to no layer"
  FILES src/quant/gptq.cpp "#include \"lowbit/serve/server.h\"")
