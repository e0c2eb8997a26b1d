# Third-party dependencies, all from Debian packages installed by scripts/setup.sh.
# Each becomes an imported/static target named kvgw_dep_<name> so modules link by name.

# kvgw_pkg_dep(<name> <prefix> <pkg-config module>): target kvgw_dep_<name> from a pkg-config
# module (a macro, so the <prefix>_* variables stay visible as they were).
macro(kvgw_pkg_dep name prefix module)
    pkg_check_modules(${prefix} REQUIRED IMPORTED_TARGET ${module})
    add_library(kvgw_dep_${name} INTERFACE)
    target_link_libraries(kvgw_dep_${name} INTERFACE PkgConfig::${prefix})
endmacro()

kvgw_pkg_dep(uv UV libuv)
kvgw_pkg_dep(hiredis HIREDIS hiredis)
kvgw_pkg_dep(jansson JANSSON jansson)
kvgw_pkg_dep(pcre2 PCRE2 libpcre2-8)
target_compile_definitions(kvgw_dep_pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8)
kvgw_pkg_dep(yaml YAML yaml-0.1)
kvgw_pkg_dep(xxhash XXHASH libxxhash)
kvgw_pkg_dep(openblas OPENBLAS openblas)
# ICU (common library only): Unicode NFC for the tokenizer (Qwen's tokenizer.json normalizes).
kvgw_pkg_dep(icu ICU icu-uc)
# libsodium: keyed BLAKE2b (cache namespaces), SHA-256 and HMAC (API keys, worker link auth).
kvgw_pkg_dep(sodium SODIUM libsodium)

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
