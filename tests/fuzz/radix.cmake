# fuzz_radix: bytes -> a sequence of radix tree operations run on the real tree and on the
# naive reference (tests/unit/radix/radix_model.h), checking every invariant after each one;
# byte 0 also switches on the failing-allocator mode. Seeds in corpus/fuzz_radix/: PRNG-made
# operation streams for each token width, with and without allocation failures.
# radix.c is compiled into the target (not linked from kvgw_radix) so that libFuzzer's
# coverage instrumentation covers the tree itself.
kvgw_add_fuzzer(NAME fuzz_radix
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_radix.c ${PROJECT_SOURCE_DIR}/radix/radix.c
    CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/fuzz_radix
    SECONDS 30)
target_include_directories(fuzz_radix PRIVATE ${PROJECT_SOURCE_DIR}/tests/unit/radix
                                              ${PROJECT_SOURCE_DIR}/radix)
