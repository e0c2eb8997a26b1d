# fuzz_render: JSON request bodies -> gw_api_parse (Anthropic, OpenAI) -> Llama 3 and ChatML
# renderers (with the real tokenizers when tests/node is installed); checks clean errors and the
# prefix property. Seeds in corpus/render/.
kvgw_add_fuzzer(NAME fuzz_render
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_render.c
    LIBS kvgw_gateway_api kvgw_engine kvgw_dep_jansson
    CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/render
    SECONDS 30)
