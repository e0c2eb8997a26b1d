# fuzz_kvtier: bytes -> a KV tier record file (engine/kvtier.c), scanned by the store's open and
# read back by a get: a bad record is never indexed or served and its file is removed; a good
# one is served whole. Seeds in corpus/fuzz_kvtier/: good records (checksummed and sealed), cut
# ones and a flipped byte, written by `KVGW_KVTIER_CORPUS=tests/fuzz/corpus/fuzz_kvtier
# build/tests/test_kvtier corpus_seeds`.
kvgw_add_fuzzer(NAME fuzz_kvtier
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_kvtier.c
    LIBS kvgw_engine
    CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/fuzz_kvtier
    SECONDS 30)
