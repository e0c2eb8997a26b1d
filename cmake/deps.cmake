# Third-party dependencies, all from Debian packages installed by scripts/setup.sh.
# Each becomes an imported/static target named kvgw_dep_<name> so modules link by name.

pkg_check_modules(UV REQUIRED IMPORTED_TARGET libuv)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
pkg_check_modules(JANSSON REQUIRED IMPORTED_TARGET jansson)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(YAML REQUIRED IMPORTED_TARGET yaml-0.1)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
# ICU (common library only): Unicode NFC for the tokenizer (Qwen's tokenizer.json normalizes).
pkg_check_modules(ICU REQUIRED IMPORTED_TARGET icu-uc)
# libsodium: keyed BLAKE2b (cache namespaces), SHA-256 and HMAC (API keys, worker link auth).
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)

add_library(kvgw_dep_uv INTERFACE)
target_link_libraries(kvgw_dep_uv INTERFACE PkgConfig::UV)
add_library(kvgw_dep_hiredis INTERFACE)
target_link_libraries(kvgw_dep_hiredis INTERFACE PkgConfig::HIREDIS)
add_library(kvgw_dep_jansson INTERFACE)
target_link_libraries(kvgw_dep_jansson INTERFACE PkgConfig::JANSSON)
add_library(kvgw_dep_pcre2 INTERFACE)
target_link_libraries(kvgw_dep_pcre2 INTERFACE PkgConfig::PCRE2)
target_compile_definitions(kvgw_dep_pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8)
add_library(kvgw_dep_yaml INTERFACE)
target_link_libraries(kvgw_dep_yaml INTERFACE PkgConfig::YAML)
add_library(kvgw_dep_xxhash INTERFACE)
target_link_libraries(kvgw_dep_xxhash INTERFACE PkgConfig::XXHASH)
add_library(kvgw_dep_openblas INTERFACE)
target_link_libraries(kvgw_dep_openblas INTERFACE PkgConfig::OPENBLAS)
add_library(kvgw_dep_sodium INTERFACE)
target_link_libraries(kvgw_dep_sodium INTERFACE PkgConfig::SODIUM)
add_library(kvgw_dep_icu INTERFACE)
target_link_libraries(kvgw_dep_icu INTERFACE PkgConfig::ICU)

# llhttp: Debian ships no library, only the C sources (package node-llhttp, llhttp 8.1.0).
set(KVGW_LLHTTP_DIR /usr/share/llhttp CACHE PATH "Directory with llhttp's api.c, http.c, llhttp.c")
set(KVGW_LLHTTP_INCLUDE /usr/share/include/llhttp CACHE PATH "Directory with llhttp.h")
if(NOT EXISTS ${KVGW_LLHTTP_DIR}/llhttp.c OR NOT EXISTS ${KVGW_LLHTTP_INCLUDE}/llhttp.h)
    message(FATAL_ERROR "llhttp sources not found in ${KVGW_LLHTTP_DIR} (run scripts/setup.sh)")
endif()
add_library(kvgw_dep_llhttp STATIC
    ${KVGW_LLHTTP_DIR}/api.c ${KVGW_LLHTTP_DIR}/http.c ${KVGW_LLHTTP_DIR}/llhttp.c)
target_include_directories(kvgw_dep_llhttp SYSTEM PUBLIC ${KVGW_LLHTTP_INCLUDE})
# Generated third-party code: keep our warning flags off it.
target_compile_options(kvgw_dep_llhttp PRIVATE -w)
