#!/usr/bin/env python3
"""layer_check.py — the modules' dependency rules, checked over the source tree.

Reads every C/CUDA source of the modules (#include "...") and every module's CMakeLists.txt
(target_link_libraries, target_include_directories) and fails when

  * a module includes or links a module it may not use (a lower module reaching up, or one of
    the side modules reaching across): see MAY_USE;
  * a module includes another module's internal header: a header is public only when it is in
    its module's PUBLIC table below; every other header (and every *_internal.h) is internal to
    its module. A new header is internal until it is listed here, on purpose: the table is the
    modules' public face, the place to look before reaching into another module;
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

# The public headers of each module: what other modules may include. Everything else in the
# module's folder is internal to it.
PUBLIC = {
    "common": {"common.h", "pc_alloc.h", "pc_arena.h", "pc_assert.h", "pc_buf.h", "pc_err.h",
               "pc_exp.h", "pc_log.h", "pc_pages.h", "pc_rss.h", "pc_time.h", "pc_u64map.h",
               "pc_heap.h", "pc_vec.h", "pc_utf8.h", "pc_json.h"},
    "radix": {"radix.h"},
    # engine.h (the engine), worker.h (its service layer) and the wire protocol (wire.h,
    # sampling.h's parameters), and the model-file tools the commands and the gateway use:
    # GGUF, hyper-parameters, vocabulary, tokenizer (+ its cache), chat rendering, mkmodel.
    "engine": {"engine.h", "worker.h", "wire.h", "sampling.h", "gguf.h", "hparams.h", "vocab.h",
               "tokenizer.h", "tokcache.h", "chat.h", "render.h", "mkmodel.h", "half.h",
               "prefix.h"},
    "link": {"lnk_addr.h", "worker_server.h", "worker_client.h", "wire_seal.h"},
    "gateway": {"serve.h", "config.h", "api.h", "cacheplan.h", "cindex.h", "router.h", "http.h",
                "metrics.h", "dashboard.h", "json_fast.h", "ns.h", "outcome.h",
                "pool.h"},
    "cmd": set(),
    "billing": {"billing.h", "ledger.h", "shipper.h"},
    "kernels": {"kernels.h"},
    "bench": {"bench.h"},
}

# Files that use their own module only through its public headers, as another module would,
# with the internal headers each may still use.
OUTER = {
    # The engine's service layer (queue, threads, pins) over engine.h; stop-sequence matching
    # (stop.h) is the worker's own per-request work, not the engine's state.
    "engine/worker.c": {"stop.h"},
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


def header_index(root):
    """Every header of the modules by its name (headers are included by name: each module's
    folder is on its users' include path)."""
    idx = {}
    for rel in sources(root):
        if rel.endswith((".h", ".cuh")):
            idx.setdefault(os.path.basename(rel), rel)
    return idx


def check_includes(root, out):
    idx = header_index(root)
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
                internal = base.endswith("_internal.h") or base not in PUBLIC[dep]
                if dep == mod:
                    mine = os.path.basename(rel)
                    public_header = mine in PUBLIC[mod] and not mine.endswith("_internal.h")
                    outer = rel in OUTER and base not in OUTER[rel]
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
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, mod)):
            dirnames.sort()
            if "CMakeLists.txt" not in filenames:
                continue
            rel = os.path.relpath(os.path.join(dirpath, "CMakeLists.txt"), root)
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
            for args in cmake_calls(text, "target_include_directories"):
                for line, a in args[1:]:
                    m = re.match(r"\$\{(?:PROJECT|CMAKE)_SOURCE_DIR\}/([a-z]+)", a)
                    dep = m and m.group(1)
                    if dep in MODULES and dep != mod and not may_use(mod, dep, rel):
                        out.append(f"{rel}:{line}: includes {a} (module {mod} -> {dep})")


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
                                  "    kvgw_bench)\n",  # up: gateway -> bench
        "billing/ledger.c": '#include "radix.h"\n',  # across: billing -> radix
        "billing/event.c": "/* gw_serve( in a comment */\nint x = gw_serve(0);\n",  # up call
        "bench/bench_x.c": 'int y = eng__kv_evict_one(0); const char *s = "eng__no";\n',
        "bench/bench.h": "",
        "cmd/cmd_worker.c": '#include "wire_conn.h" // internal to link\n#include "bench.h"\n',
        "cmd/CMakeLists.txt": "target_link_libraries(kvgw PRIVATE kvgw_bench kvgw_gateway)\n",
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
