# fuzz_worker_server: bytes from a hostile gateway -> the worker server (link/worker_server.c)
# over loopback TCP, with a real worker on a small generated model; the server must close the
# connection cleanly, send only valid frames and be left with no connection and no live
# request. Byte 0 bit 1 picks a server with a link secret: the target authenticates and seals
# the input (bit 2: sends it unsealed, the record layer's refusals), so the frame parser behind
# the record layer is fuzzed too. Seeds in corpus/fuzz_worker_server/ (byte 0 bit 0: a valid
# HELLO goes first), written
# by `KVGW_WNET_CORPUS=tests/fuzz/corpus/fuzz_worker_server build/tests/test_worker_net
# corpus_seeds`. The server, its connection layer and the codec are compiled into the target
# (not linked from the libraries) so that libFuzzer's coverage instrumentation covers them.
kvgw_add_fuzzer(NAME fuzz_worker_server
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_worker_server.c
            ${PROJECT_SOURCE_DIR}/link/worker_server.c ${PROJECT_SOURCE_DIR}/link/wire_conn.c
            ${PROJECT_SOURCE_DIR}/link/wire_seal.c
            ${PROJECT_SOURCE_DIR}/link/lnk_addr.c
            ${PROJECT_SOURCE_DIR}/engine/wire.c
    LIBS kvgw_engine kvgw_dep_uv kvgw_dep_xxhash kvgw_dep_sodium Threads::Threads
    CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/fuzz_worker_server
    SECONDS 30)
target_include_directories(fuzz_worker_server PRIVATE ${PROJECT_SOURCE_DIR}/link)
