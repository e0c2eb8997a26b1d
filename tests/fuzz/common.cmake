# The shared structures of common/ (pc_u64map, pc_strmap, pc_heap with pc_vec, pc_utf8,
# pc_json), each against a naive reference or jansson. common/'s sources are compiled into each target (not
# linked from kvgw_common) so that libFuzzer's coverage instrumentation covers them. Seeds in
# corpus/pc_*/.
foreach(t u64map strmap heap utf8 json)
    set(_src ${PROJECT_SOURCE_DIR}/common/pc_${t}.c)
    if(t STREQUAL "heap")
        list(APPEND _src ${PROJECT_SOURCE_DIR}/common/pc_vec.c)
    elseif(t STREQUAL "strmap")
        list(APPEND _src ${PROJECT_SOURCE_DIR}/common/pc_u64map.c)
    endif()
    set(_libs "")
    if(t STREQUAL "json")
        list(APPEND _src ${PROJECT_SOURCE_DIR}/common/pc_utf8.c)
        set(_libs kvgw_dep_jansson)
    endif()
    kvgw_add_fuzzer(NAME fuzz_pc_${t}
        SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_pc_${t}.c ${_src}
        LIBS ${_libs}
        CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/pc_${t}
        SECONDS 20)
endforeach()
