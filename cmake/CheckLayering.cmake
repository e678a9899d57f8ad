# cmake -DLOWBIT_ROOT=<tree> -P cmake/CheckLayering.cmake: the layer rule of docs/ARCHITECTURE.md, checked on
# every #include of src/ and include/lowbit/. Run by every build (target lowbit_layering) and by ctest (test
# layering). Fails with one line per offending include.
#
# The compiler already keeps a layer out of other layers' private headers (each layer's private include root is
# its own folder); all layers share include/ for their public headers, so this check is what keeps a lower layer
# from including a higher layer's public header. It also refuses what an include path cannot stop: a quoted
# include reaching out of the layer's folder ("../kernels/cuda/x.h") and a public header including a private one.
cmake_minimum_required(VERSION 3.25)
if(NOT LOWBIT_ROOT)
  message(FATAL_ERROR "usage: cmake -DLOWBIT_ROOT=<source tree> -P CheckLayering.cmake")
endif()

# Layers, lowest first: each one's source folder, the prefix of its public headers under include/, and the
# layers whose public headers it may include besides its own.
set(layers core io codec artifact kernels_cpu kernels_cuda model eval quant cli)
set(core_dir core)                 # core's public headers: include/lowbit/core/...
set(io_dir io)
set(codec_dir codec)
set(artifact_dir artifact)
set(kernels_cpu_dir kernels/cpu)   # include/lowbit/kernels/cpu.h, include/lowbit/kernels/cpu_*.h
set(kernels_cuda_dir kernels/cuda) # include/lowbit/kernels/cuda.h, include/lowbit/kernels/cuda_*.h
set(model_dir model)
set(eval_dir eval)
set(quant_dir quant)
set(cli_dir cli)
set(core_below)
set(io_below core)
set(codec_below core io)
set(artifact_below core io codec)
set(kernels_cpu_below core io codec)
set(kernels_cuda_below core io codec)
set(model_below core io codec artifact kernels_cpu kernels_cuda)
set(eval_below ${model_below} model)
set(quant_below ${eval_below} eval)
set(cli_below ${quant_below} quant)

# The layer owning a public header, by its path under include/ ("lowbit/kernels/cuda_model_ops.h").
function(public_header_layer header out)
  set(${out} "" PARENT_SCOPE)
  foreach(layer IN LISTS layers)
    if(header MATCHES "^lowbit/${${layer}_dir}(/|\\.h$|_)")
      set(${out} ${layer} PARENT_SCOPE)
      return()
    endif()
  endforeach()
endfunction()

set(violations)
file(GLOB_RECURSE files RELATIVE ${LOWBIT_ROOT}
  ${LOWBIT_ROOT}/src/*.h ${LOWBIT_ROOT}/src/*.cpp ${LOWBIT_ROOT}/src/*.cu ${LOWBIT_ROOT}/src/*.cuh
  ${LOWBIT_ROOT}/include/lowbit/*.h)
foreach(file IN LISTS files)
  # Which layer the file belongs to, and whether it is one of its public headers.
  set(owner "")
  foreach(layer IN LISTS layers)
    if(file MATCHES "^src/${${layer}_dir}/")
      set(owner ${layer})
      set(public FALSE)
      break()
    endif()
  endforeach()
  if(NOT owner AND file MATCHES "^include/(.*)$")
    public_header_layer("${CMAKE_MATCH_1}" owner)
    set(public TRUE)
  endif()
  if(NOT owner)
    list(APPEND violations "${file}: belongs to no layer (src/<layer>/ or include/lowbit/<layer>/)")
    continue()
  endif()

  file(STRINGS ${LOWBIT_ROOT}/${file} lines REGEX "^[ \t]*#[ \t]*include")
  foreach(line IN LISTS lines)
    if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*[<\"](lowbit/[^>\"]*)[>\"]")
      set(header ${CMAKE_MATCH_1})
      public_header_layer("${header}" target)
      if(NOT target)
        list(APPEND violations "${file}: includes ${header}, which belongs to no layer")
      elseif(NOT target STREQUAL owner AND NOT target IN_LIST ${owner}_below)
        string(REPLACE ";" ", " may "${owner};${${owner}_below}")
        list(APPEND violations
          "${file}: includes ${header} of layer ${target} (layer ${owner} may include ${may})")
      endif()
    elseif(line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\"")
      # A private header: it must lie in the including layer's own folder, and public headers have none.
      set(header ${CMAKE_MATCH_1})
      get_filename_component(here ${LOWBIT_ROOT}/${file} DIRECTORY)
      set(layer_root ${LOWBIT_ROOT}/src/${${owner}_dir})
      get_filename_component(beside "${here}/${header}" ABSOLUTE)
      get_filename_component(rooted "${layer_root}/${header}" ABSOLUTE)
      if(public)
        list(APPEND violations "${file}: public header includes \"${header}\", which is not a public header")
      elseif(header MATCHES "(^|/)\\.\\.(/|$)" OR NOT (EXISTS ${beside} OR EXISTS ${rooted}))
        list(APPEND violations
          "${file}: includes \"${header}\", which is not in layer ${owner}'s folder src/${${owner}_dir}/")
      endif()
    endif()
  endforeach()
endforeach()

if(violations)
  foreach(violation IN LISTS violations)
    message("layering: ${violation}")
  endforeach()
  list(LENGTH violations count)
  message(FATAL_ERROR "layering: ${count} include(s) break the layers of docs/ARCHITECTURE.md")
endif()
