# fuzz_ledger: bytes -> a ledger segment file, replayed by the reader and recovered by
# bill_ledger_open (billing/ledger.c); torn tails are cut, good records never lost, damage is a
# FORMAT error. Seeds in corpus/fuzz_ledger/: good segments, torn tails, flipped bytes, a bad
# header, written by `KVGW_LEDGER_CORPUS=tests/fuzz/corpus/fuzz_ledger build/tests/test_ledger
# corpus_seeds`.
kvgw_add_fuzzer(NAME fuzz_ledger
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_ledger.c
    LIBS kvgw_billing
    CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/fuzz_ledger
    SECONDS 30)
