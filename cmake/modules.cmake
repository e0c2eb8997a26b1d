# kvgw_module_headers(<target> [PUBLIC header...])
#
# A library's public face, enforced by the compiler. The headers listed are the ones other
# modules may include; they are linked into <build>/<module>/include/<target>, the library's
# PUBLIC include directory. The module's own folder is a PRIVATE include directory, so a file of
# another module that includes an internal header (model.h, kvpool.h, ...) fails to compile,
# and so does a public header that includes an internal one, in every other module that uses it.
# A folder with several libraries (gateway/, link/, kernels/) calls it once per library, each
# with its own headers (or none: kvgw_kernels' face is kvgw_kernels_ref's kernels.h).
#
# These calls are the one list of public headers: tests/layer_check.py reads them. common/ is
# the one module without it: every common header is public (its folder is the PUBLIC include
# directory), so a new common header needs no second line.
#
# <target>_internal (an INTERFACE library) puts the whole folder on the include path: the
# module's own tests, which check its internals, link it. No other module may.
function(kvgw_module_headers target)
    cmake_parse_arguments(H "" "" "PUBLIC" ${ARGN})
    set(dir ${CMAKE_CURRENT_BINARY_DIR}/include/${target})
    file(REMOVE_RECURSE ${dir})
    file(MAKE_DIRECTORY ${dir})
    foreach(h ${H_PUBLIC})
        if(NOT EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${h})
            message(FATAL_ERROR "kvgw_module_headers(${target}): no header ${h}")
        endif()
        file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR}/${h} ${dir}/${h} SYMBOLIC)
    endforeach()
    target_include_directories(${target} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
    target_include_directories(${target} PUBLIC ${dir})
    add_library(${target}_internal INTERFACE)
    target_include_directories(${target}_internal INTERFACE ${CMAKE_CURRENT_SOURCE_DIR})
    target_link_libraries(${target}_internal INTERFACE ${target})
endfunction()
