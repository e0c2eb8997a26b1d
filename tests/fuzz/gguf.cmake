# fuzz_gguf: arbitrary bytes -> the GGUF reader (open, every value and array element through
# every accessor, every tensor's first and last byte) -> hyper-parameters and the tensor check.
# Asserts that a file either opens with every view inside the bytes or fails with a message.
# Seeds in corpus/fuzz_gguf/: small generated models of each architecture and dtype, a file
# with every metadata type and nested arrays, and hand-made hostile headers.
kvgw_add_fuzzer(NAME fuzz_gguf
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_gguf.c
    LIBS kvgw_engine
    CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/fuzz_gguf
    SECONDS 30)
