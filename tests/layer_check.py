#!/usr/bin/env python3
"""layer_check.py — the modules' dependency rules, checked over the source tree.

Reads every C/CUDA source of the modules (#include "...") and every module's CMakeLists.txt
(target_link_libraries, target_include_directories) and fails when

  * a module includes or links a module it may not use (a lower module reaching up, or one of
    the side modules reaching across): see MAY_USE;
  * a module includes another module's internal header: a header is public only when its
    module's CMakeLists.txt lists it in a kvgw_module_headers(<target> PUBLIC ...) call
    (cmake/modules.cmake: the headers the compiler lets other modules see, read here so the two
    cannot disagree); every other header (and every *_internal.h) is internal to its module. A
    new header is internal until it is listed there, on purpose. common/ alone puts its whole
    folder on its users' include path (every header of it is public); any other module doing so
    is a violation;
  * a module's CMakeLists.txt puts another module's folder on an include path, or links another
    module's <target>_internal (its tests' view of the internals);
  * a public header includes an internal header of its own module (every includer would see
    the internals), or a file that sits on its own module's public face (OUTER: the engine's
    service layer) includes one of its internal headers;
  * a module calls a function of a module it may not use (by the prefixes of STYLE.md: a call
    `gw_x(` from engine/), or uses another module's internal symbol (`eng__x`: the double
    underscore marks an internal non-static symbol).

The order (docs: the top-level CMakeLists.txt):

    common <- radix <- engine <- link <- gateway <- cmd
    common <- billing (beside: gateway, bench and cmd may use it)
    common <- kernels <- engine/cuda/ (the CUDA backend only)
    bench: may use every module but cmd; only cmd uses bench
    tests/: may use anything (not checked)

Each violation is printed as `file:line: includes X (module A -> B)` (or `links`), and the exit
status is 1. Usage: layer_check.py [ROOT] (default: the repository holding this script);
layer_check.py --self-test plants one violation of each kind in a scratch tree and expects
exactly those.
"""
import os
import re
import sys

MODULES = ["common", "radix", "engine", "link", "gateway", "cmd", "billing", "kernels", "bench"]

# Which modules each module may use (itself always).
MAY_USE = {
    "common": set(),
    "radix": {"common"},
    "engine": {"common", "radix"},  # + kernels from engine/cuda/ only (below)
    "link": {"common", "radix", "engine"},
    "gateway": {"common", "radix", "engine", "link", "billing"},
    "cmd": {"common", "radix", "engine", "link", "gateway", "billing", "kernels", "bench"},
    "billing": {"common"},
    "kernels": {"common"},
    "bench": {"common", "radix", "engine", "link", "gateway", "billing", "kernels"},
}
# engine/cuda/ is the engine's CUDA backend, the one place that calls kernels/.
CUDA_DIR = "engine/cuda/"

# The one module whose folder is its PUBLIC include directory: every header of common/ is
# public (the basics every module needs), so a new one needs no second line in its CMakeLists.
ALL_PUBLIC = {"common"}

# Files that use their own module only through its public headers, as another module would.
OUTER = {
    "engine/worker.c",  # the engine's service layer (queue, threads, pins) over engine.h
}

# Known reaches kept on purpose, each entry (file, included header or linked module) with its
# reason. Empty: the engine's reaches (engine.h including model.h/kvpool.h/backend.h,
# worker.c on engine_internal.h, bench_sampler.c on eng__cpu_isa_*) are gone.
ALLOWED = set()

# Symbol prefixes (STYLE.md) -> module.
PREFIXES = {"pc": "common", "rdx": "radix", "eng": "engine", "lnk": "link", "gw": "gateway",
            "bill": "billing", "krn": "kernels", "kvgw": "cmd", "bench": "bench"}
SYMBOL_RE = re.compile(r"\b(" + "|".join(PREFIXES) + r")_(_?)\w+(\s*\()?")

# CMake target -> module.
TARGETS = {
    "kvgw_common": "common", "kvgw_radix": "radix", "kvgw_engine": "engine",
    "kvgw_kernels": "kernels", "kvgw_kernels_ref": "kernels", "kvgw_link": "link",
    "kvgw_link_addr": "link", "kvgw_billing": "billing", "kvgw_bench": "bench", "kvgw": "cmd",
}
TARGET_PREFIXES = [("kvgw_gateway", "gateway")]

SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def module_of(rel):
    top = rel.split("/", 1)[0]
    return top if top in MODULES else None


def target_module(name):
    if name.endswith("_internal"):
        name = name[: -len("_internal")]
    if name in TARGETS:
        return TARGETS[name]
    for prefix, mod in TARGET_PREFIXES:
        if name.startswith(prefix):
            return mod
    return None  # a dependency (kvgw_dep_*), a system library, a keyword


def may_use(mod, dep, rel):
    if dep == mod or dep in MAY_USE[mod]:
        return True
    return mod == "engine" and dep == "kernels" and rel.startswith(CUDA_DIR)


def sources(root):
    for mod in MODULES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, mod)):
            dirnames.sort()
            for f in sorted(filenames):
                if f.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def cmake_files(root, mod):
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, mod)):
        dirnames.sort()
        if "CMakeLists.txt" in filenames:
            yield os.path.relpath(os.path.join(dirpath, "CMakeLists.txt"), root)


def own_folder_public(args):
    """The lines at which a target_include_directories call puts the CMakeLists.txt's own folder
    on a PUBLIC or INTERFACE include path."""
    scope = None
    for line, a in args[1:]:
        if a in ("PUBLIC", "PRIVATE", "INTERFACE"):
            scope = a
        elif scope != "PRIVATE" and re.fullmatch(r"\$\{CMAKE_CURRENT_SOURCE_DIR\}/?", a):
            yield line


def public_headers(root):
    """{module: set of public headers (paths from root)}, read from the kvgw_module_headers
    calls of each module's CMakeLists.txt files; ALL_PUBLIC's modules: every header."""
    public = {mod: set() for mod in MODULES}
    for rel in sources(root):
        if rel.endswith((".h", ".cuh")) and module_of(rel) in ALL_PUBLIC:
            public[module_of(rel)].add(rel)
    for mod in MODULES:
        for cm in cmake_files(root, mod):
            with open(os.path.join(root, cm), encoding="utf-8") as f:
                text = f.read()
            for args in cmake_calls(text, "kvgw_module_headers"):
                names = [a for _, a in args[1:]]
                if "PUBLIC" in names:
                    for h in names[names.index("PUBLIC") + 1:]:
                        public[mod].add(os.path.normpath(os.path.join(os.path.dirname(cm), h)))
    return public


def header_index(root):
    """Every header of the modules by its name (headers are included by name: a module's
    public headers sit in one include directory per library, cmake/modules.cmake)."""
    idx = {}
    for rel in sources(root):
        if rel.endswith((".h", ".cuh")):
            idx.setdefault(os.path.basename(rel), rel)
    return idx


def check_includes(root, out):
    idx = header_index(root)
    public = public_headers(root)
    for rel in sources(root):
        mod = module_of(rel)
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for no, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                name = m.group(1)
                local = os.path.normpath(os.path.join(os.path.dirname(rel), name))
                target = local if os.path.exists(os.path.join(root, local)) else idx.get(name)
                if target is None:
                    continue  # generated (dashboard_html.inc) or outside the modules
                dep = module_of(target)
                if dep is None or (rel, os.path.basename(name)) in ALLOWED:
                    continue
                base = os.path.basename(target)
                internal = base.endswith("_internal.h") or target not in public[dep]
                if dep == mod:
                    mine = os.path.basename(rel)
                    public_header = rel in public[mod] and not mine.endswith("_internal.h")
                    outer = rel in OUTER
                    if internal and (public_header or outer):
                        what = "a public header" if public_header else "an outer file"
                        out.append(f"{rel}:{no}: includes {name} (module {mod} -> {dep}: "
                                   f"{what} of {mod} includes one of its internal headers)")
                    continue
                if not may_use(mod, dep, rel):
                    out.append(f"{rel}:{no}: includes {name} (module {mod} -> {dep})")
                elif internal:
                    out.append(f"{rel}:{no}: includes {name} (module {mod} -> {dep}: "
                               f"internal to {dep})")


def code_only(text):
    """The text with comments and string literals blanked (line numbers kept)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(\\.|[^"\\\n])*"', '""', text)


def check_symbols(root, out):
    for rel in sources(root):
        mod = module_of(rel)
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = code_only(f.read())
        for m in SYMBOL_RE.finditer(text):
            dep = PREFIXES[m.group(1)]
            name = m.group(0).rstrip("( \t\n")
            if dep == mod or (rel, name) in ALLOWED:
                continue
            line = text.count("\n", 0, m.start()) + 1
            if not may_use(mod, dep, rel) and m.group(3):
                out.append(f"{rel}:{line}: calls {name} (module {mod} -> {dep})")
            elif m.group(2):
                out.append(f"{rel}:{line}: uses {name} (module {mod} -> {dep}: internal to "
                           f"{dep})")


def cmake_calls(text, command):
    """[(line, arg)] of every command(...) in a CMakeLists.txt, each argument with its own line
    (comments removed)."""
    text = re.sub(r"#[^\n]*", "", text)
    for m in re.finditer(command + r"\s*\(([^)]*)\)", text):
        yield [(text.count("\n", 0, m.start(1) + a.start()) + 1, a.group(0))
               for a in re.finditer(r"\S+", m.group(1))]


def check_cmake(root, out):
    for mod in MODULES:
        for rel in cmake_files(root, mod):
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                text = f.read()
            for args in cmake_calls(text, "target_link_libraries"):
                for line, a in args[1:]:
                    dep = target_module(a)
                    if dep is None or dep == mod or (rel, dep) in ALLOWED:
                        continue
                    # engine/CMakeLists.txt links kvgw_kernels for engine/cuda/ only.
                    cuda = mod == "engine" and dep == "kernels"
                    if not cuda and not may_use(mod, dep, rel):
                        out.append(f"{rel}:{line}: links {a} (module {mod} -> {dep})")
                    elif a.endswith("_internal"):
                        out.append(f"{rel}:{line}: links {a} (module {mod} -> {dep}: internal "
                                   f"to {dep})")
            for args in cmake_calls(text, "target_include_directories"):
                for line, a in args[1:]:
                    m = re.match(r"\$\{(?:PROJECT|CMAKE)_SOURCE_DIR\}/([a-z]+)", a)
                    dep = m and m.group(1)
                    if dep in MODULES and dep != mod:
                        # Another module's folder holds its internal headers: never on the path.
                        why = f": internal to {dep}" if may_use(mod, dep, rel) else ""
                        out.append(f"{rel}:{line}: includes {a} (module {mod} -> {dep}{why})")
                if mod not in ALL_PUBLIC:
                    for line in own_folder_public(args):
                        out.append(f"{rel}:{line}: makes every header of {mod} public (use "
                                   f"kvgw_module_headers, cmake/modules.cmake)")


def check(root):
    out = []
    check_includes(root, out)
    check_symbols(root, out)
    check_cmake(root, out)
    return out


def self_test():
    """Plants one violation of each kind in a small tree and expects exactly those lines."""
    import tempfile
    files = {
        # The public faces, as the CMakeLists.txt files declare them.
        "common/CMakeLists.txt": "target_include_directories(kvgw_common PUBLIC\n"
                                 "    ${CMAKE_CURRENT_SOURCE_DIR})\n",  # all public: allowed
        "radix/CMakeLists.txt": "kvgw_module_headers(kvgw_radix PUBLIC radix.h)\n",
        "engine/CMakeLists.txt": "kvgw_module_headers(kvgw_engine PUBLIC engine.h # the core\n"
                                 "    worker.h)\n",
        "kernels/CMakeLists.txt": "kvgw_module_headers(kvgw_kernels_ref PUBLIC kernels.h)\n",
        "link/CMakeLists.txt": "kvgw_module_headers(kvgw_link PUBLIC worker_server.h)\n",
        "bench/CMakeLists.txt": "kvgw_module_headers(kvgw_bench PUBLIC bench.h)\n",
        "common/pc_err.h": "",
        "radix/radix.h": '#include "pc_err.h"\n',
        "radix/radix.c": '#include "radix.h"\n#include "worker.h"\n',  # up: radix -> engine
        "engine/engine.h": '#include "model.h"\n',  # a public header exposes an internal one
        "engine/model.h": "",
        "engine/worker.h": '#include "engine.h"\n',
        "engine/engine_internal.h": "",
        "engine/worker.c": '#include "engine_internal.h"\n',  # the outer file reaches in
        "engine/cuda/backend_cuda.c": '#include "kernels.h"\n',  # allowed: the CUDA backend
        "engine/cpu.c": '#include "kernels.h"\n',  # kernels outside engine/cuda/
        "kernels/kernels.h": "",
        "link/wire_conn.h": "",
        "link/worker_server.h": "",
        "gateway/serve.c": '#include "worker_server.h"\n#include "bench.h"\n',  # gateway -> bench
        "gateway/CMakeLists.txt": "target_link_libraries(kvgw_gateway PUBLIC kvgw_link\n"
                                  "    kvgw_bench)\n"  # up: gateway -> bench
                                  "target_include_directories(kvgw_gateway PUBLIC\n"
                                  "    ${CMAKE_CURRENT_SOURCE_DIR})\n"  # every header public
                                  "target_include_directories(kvgw_gateway_api PRIVATE\n"
                                  "    ${PROJECT_SOURCE_DIR}/engine)\n",  # engine's internals
        "billing/ledger.c": '#include "radix.h"\n',  # across: billing -> radix
        "billing/event.c": "/* gw_serve( in a comment */\nint x = gw_serve(0);\n",  # up call
        "bench/bench_x.c": 'int y = eng__kv_evict_one(0); const char *s = "eng__no";\n',
        "bench/bench.h": "",
        "cmd/cmd_worker.c": '#include "wire_conn.h" // internal to link\n#include "bench.h"\n',
        "cmd/CMakeLists.txt": "target_link_libraries(kvgw PRIVATE kvgw_bench kvgw_gateway\n"
                              "    kvgw_engine_internal)\n",  # the engine's tests' view
        "tests/unit/test_x.c": '#include "engine_internal.h"\n',  # tests may use anything
    }
    want = [
        "radix/radix.c:2: includes worker.h (module radix -> engine)",
        "engine/engine.h:1: includes model.h (module engine -> engine: a public header of engine "
        "includes one of its internal headers)",
        "engine/worker.c:1: includes engine_internal.h (module engine -> engine: an outer file of "
        "engine includes one of its internal headers)",
        "engine/cpu.c:1: includes kernels.h (module engine -> kernels)",
        "gateway/serve.c:2: includes bench.h (module gateway -> bench)",
        "gateway/CMakeLists.txt:2: links kvgw_bench (module gateway -> bench)",
        "gateway/CMakeLists.txt:4: makes every header of gateway public (use "
        "kvgw_module_headers, cmake/modules.cmake)",
        "gateway/CMakeLists.txt:6: includes ${PROJECT_SOURCE_DIR}/engine (module gateway -> "
        "engine: internal to engine)",
        "cmd/CMakeLists.txt:2: links kvgw_engine_internal (module cmd -> engine: internal to "
        "engine)",
        "billing/ledger.c:1: includes radix.h (module billing -> radix)",
        "cmd/cmd_worker.c:1: includes wire_conn.h (module cmd -> link: internal to link)",
        "billing/event.c:2: calls gw_serve (module billing -> gateway)",
        "bench/bench_x.c:1: uses eng__kv_evict_one (module bench -> engine: internal to engine)",
    ]
    with tempfile.TemporaryDirectory() as root:
        for rel, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
                f.write(text)
        saved = set(ALLOWED)
        ALLOWED.clear()
        try:
            got = check(root)
        finally:
            ALLOWED.update(saved)
    if sorted(got) != sorted(want):
        for g in sorted(set(got) - set(want)):
            print(f"self-test: unexpected: {g}")
        for w in sorted(set(want) - set(got)):
            print(f"self-test: missed: {w}")
        return 1
    print(f"layer_check self-test: the {len(want)} planted violations found, nothing else")
    return 0


def main():
    if sys.argv[1:2] == ["--self-test"]:
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    out = check(root)
    for v in out:
        print(v)
    if out:
        print(f"layer_check: {len(out)} violation(s) of the module rules (tests/layer_check.py)")
        return 1
    print("layer_check: every include and link runs downward, through public headers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
