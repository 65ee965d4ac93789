# tessera_grpc and tessera_protobuf: the gRPC and protobuf every tessera
# target links (the launcher's coordination protocol, parallel/'s plan).
#
# gRPC without TLS (grpc++_unsecure): the coordinator and its clients use
# insecure credentials (a job token, docs/launcher.md), and the secure
# library would load libssl at every worker's start for nothing.
#
# TESSERA_STATIC_GRPC (default ON, OFF under a sanitizer): link gRPC,
# protobuf, abseil, upb, c-ares and zlib from Debian's static archives (the
# same packages' .a files) instead of their ~55 shared objects. Every
# process pays for those at start: `tessera_hello --help` took 11-16 ms of
# CPU (perf stat), half of it in the dynamic loader resolving the libraries'
# symbols and most of the rest in the kernel mapping them; linked
# statically, 3.5-4.5 ms (docs/launcher.md, "Benchmark"), which matters for
# 128 workers on 2 cores. Only executables link these targets (the torch
# module does not), and every target takes protobuf from here, so a process
# never holds two copies of it. Under a sanitizer they stay shared: the
# suppression lists (tests/sanitizers/) name the libraries.

if(TESSERA_SANITIZE)
  set(_tessera_static_grpc_default OFF)
else()
  set(_tessera_static_grpc_default ON)
endif()
option(TESSERA_STATIC_GRPC "Link gRPC, protobuf and abseil statically (faster process start)"
       ${_tessera_static_grpc_default})

# The .a beside an imported shared library (libfoo.so.1.2 -> libfoo.a), or
# the library itself when there is none.
function(_tessera_static_sibling out lib)
  string(REGEX REPLACE "\\.so(\\.[0-9.]+)?$" ".a" _a "${lib}")
  if(NOT _a STREQUAL lib AND EXISTS "${_a}")
    set(${out} "${_a}" PARENT_SCOPE)
  else()
    set(${out} "${lib}" PARENT_SCOPE)
  endif()
endfunction()

# Depth-first over an imported target's INTERFACE_LINK_LIBRARIES: appends
# each library's archive (after its dependencies) and plain link items to
# the global properties TESSERA_GRPC_LINK and TESSERA_GRPC_INCLUDES.
function(_tessera_static_walk item)
  get_property(_seen GLOBAL PROPERTY TESSERA_GRPC_SEEN)
  if(item IN_LIST _seen)
    return()
  endif()
  set_property(GLOBAL APPEND PROPERTY TESSERA_GRPC_SEEN "${item}")
  if(NOT TARGET "${item}")
    # Plain items: -pthread, dl, m, rt, -lre2, -latomic, -L dirs. abseil's
    # "-Wl,--push-state,--as-needed" brackets are dropped: --as-needed is
    # on for every tessera target already (tessera_flags).
    if(NOT item MATCHES "^-Wl,--(push|pop)-state")
      set_property(GLOBAL APPEND PROPERTY TESSERA_GRPC_LINK "${item}")
    endif()
    return()
  endif()
  get_target_property(_type "${item}" TYPE)
  get_target_property(_deps "${item}" INTERFACE_LINK_LIBRARIES)
  get_target_property(_inc "${item}" INTERFACE_INCLUDE_DIRECTORIES)
  if(_inc)
    set_property(GLOBAL APPEND PROPERTY TESSERA_GRPC_INCLUDES "${_inc}")
  endif()
  if(_deps)
    foreach(_d IN LISTS _deps)
      _tessera_static_walk("${_d}")
    endforeach()
  endif()
  if(NOT _type STREQUAL "INTERFACE_LIBRARY")
    set(_loc "")
    foreach(_p IMPORTED_LOCATION_NONE IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_RELWITHDEBINFO IMPORTED_LOCATION)
      get_target_property(_l "${item}" ${_p})
      if(_l AND NOT _loc)
        set(_loc "${_l}")
      endif()
    endforeach()
    if(NOT _loc)
      message(FATAL_ERROR "TESSERA_STATIC_GRPC: no library file for ${item}; configure with -DTESSERA_STATIC_GRPC=OFF")
    endif()
    _tessera_static_sibling(_a "${_loc}")
    # Prepended: a library comes before the ones it depends on, as the
    # linker resolves archives left to right.
    get_property(_link GLOBAL PROPERTY TESSERA_GRPC_LINK)
    set_property(GLOBAL PROPERTY TESSERA_GRPC_LINK "${_a};${_link}")
  endif()
endfunction()

add_library(tessera_grpc INTERFACE)
add_library(tessera_protobuf INTERFACE)
if(TESSERA_STATIC_GRPC)
  set_property(GLOBAL PROPERTY TESSERA_GRPC_SEEN "")
  set_property(GLOBAL PROPERTY TESSERA_GRPC_LINK "")
  set_property(GLOBAL PROPERTY TESSERA_GRPC_INCLUDES "")
  _tessera_static_walk(gRPC::grpc++_unsecure)
  get_property(_link GLOBAL PROPERTY TESSERA_GRPC_LINK)
  get_property(_inc GLOBAL PROPERTY TESSERA_GRPC_INCLUDES)
  list(REMOVE_DUPLICATES _inc)
  _tessera_static_sibling(_protobuf_a "${Protobuf_LIBRARY}")
  if(NOT _protobuf_a MATCHES "\\.a$")
    message(FATAL_ERROR "TESSERA_STATIC_GRPC: no static protobuf beside ${Protobuf_LIBRARY}; configure with -DTESSERA_STATIC_GRPC=OFF")
  endif()
  # A group: the archives' order above is a dependency order, the group
  # makes the link independent of it (abseil's libraries refer to each
  # other in more than one direction).
  target_link_libraries(tessera_grpc INTERFACE -Wl,--start-group ${_link} -Wl,--end-group)
  target_include_directories(tessera_grpc SYSTEM INTERFACE ${_inc})
  target_link_libraries(tessera_protobuf INTERFACE ${_protobuf_a} Threads::Threads)
  target_include_directories(tessera_protobuf SYSTEM INTERFACE ${Protobuf_INCLUDE_DIRS})
  list(LENGTH _link _n)
  message(STATUS "tessera: gRPC, protobuf and abseil linked statically (${_n} link items; TESSERA_STATIC_GRPC)")
else()
  target_link_libraries(tessera_grpc INTERFACE gRPC::grpc++_unsecure)
  target_link_libraries(tessera_protobuf INTERFACE protobuf::libprotobuf)
endif()
