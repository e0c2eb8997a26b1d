# fuzz_api: request body bytes -> gw_api_parse as Anthropic messages, count_tokens and OpenAI
# chat; checks clean errors (valid JSON error bodies) and the validated request's invariants
# (breakpoint count and TTL order, sampling ranges, stop limits). Seeds in corpus/api/.
kvgw_add_fuzzer(NAME fuzz_api
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_api.c
    LIBS kvgw_gateway_api kvgw_dep_jansson
    CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/api
    SECONDS 30)
