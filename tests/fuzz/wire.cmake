# fuzz_wire: bytes -> the worker protocol decoder (engine/wire.c), either as a stream fed in
# chunks or as one payload of a chosen type; every decoded frame must re-encode to the exact
# bytes it came from. Seeds in corpus/fuzz_wire/: every frame type (framed and as a bare
# payload), a mixed stream, and hostile headers, written by
# `KVGW_WIRE_CORPUS=tests/fuzz/corpus/fuzz_wire build/tests/test_wire corpus_seeds`.
kvgw_add_fuzzer(NAME fuzz_wire
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_wire.c
    LIBS kvgw_engine
    CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/fuzz_wire
    SECONDS 30)
