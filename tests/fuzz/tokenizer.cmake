# fuzz_tokenizer: arbitrary bytes -> encode with the real Llama 3, Qwen 3 and Llama 2 tokenizers
# (tests/node) -> decode; asserts the lossless round trip, whole-UTF-8 streaming and that no
# control token is ever produced. Seeds in corpus/tokenizer/.
kvgw_add_fuzzer(NAME fuzz_tokenizer
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_tokenizer.c
    LIBS kvgw_engine_internal # tokenizer_internal.h: the pre-tokenizer's pieces
    CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/tokenizer
    SECONDS 30)
