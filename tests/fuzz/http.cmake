# fuzz_http: bytes from a hostile client -> the gateway's HTTP server (gateway/http.c) over
# loopback TCP, with a handler that echoes, streams and holds requests; the server must answer
# only with valid HTTP/1.1 responses, close the connection and be left with no connection and no
# request neither ended nor aborted. Seeds in corpus/fuzz_http/ (byte 0 bit 0: split the rest
# into two writes). The server is compiled into the target (not linked from kvgw_gateway_http)
# so that libFuzzer's coverage instrumentation covers it.
kvgw_add_fuzzer(NAME fuzz_http
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_http.c ${PROJECT_SOURCE_DIR}/gateway/http.c
    LIBS kvgw_dep_llhttp kvgw_dep_uv
    CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/fuzz_http
    SECONDS 30)
target_include_directories(fuzz_http PRIVATE ${PROJECT_SOURCE_DIR}/gateway)
