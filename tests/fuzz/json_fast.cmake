# fuzz_json_fast: bytes -> gw_json_loadb and jansson's json_loadb with the request parser's flags
# (and with none); both must give the same tree (compact dump, key order included) or the same
# error. Seeds in corpus/json_fast/.
kvgw_add_fuzzer(NAME fuzz_json_fast
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_json_fast.c
    LIBS kvgw_gateway_api kvgw_dep_jansson
    CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/json_fast
    SECONDS 30)
