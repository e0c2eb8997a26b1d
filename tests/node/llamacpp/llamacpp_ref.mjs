// llamacpp_ref.mjs — llama.cpp side by side with kvgw, through node-llama-cpp's prebuilt
// llama.cpp (scripts/setup-llamacpp.sh installs node-llama-cpp and its linux-x64 binaries into
// tests/node/llamacpp; nothing is compiled or downloaded at install or run time).
//
//   node tests/node/llamacpp/llamacpp_ref.mjs --model FILE [--tokens FILE.json | --text FILE]
//        [--n-tokens N] [--kv f32,f16,q8_0] [--top 10] [--threads 2]
//        [--kvgw BIN] [--kvgw-kv f32,f16,q8_0] [--kvgw-gemm f32] [--save-tokens FILE]
//        [--bench] [--prefill 512] [--decode 64] [--json OUT]
//
// Accuracy: llama.cpp evaluates the token sequence once per KV cache type (K and V both of
// that type, flash attention on, as `llama-cli -fa on -ctk T -ctv T`) and reports, per position,
// the log-probs of its top-N tokens. Each run is compared with the F32-KV run of the same
// engine in the terms of kvgw's tests: over every position and every token of the reference's
// top-N, max and mean |Δ log-prob|; top-1 agreement over all positions, and over the positions
// where the reference's top-2 gap exceeds 0.1 (issue 25's "decisive" positions). With --kvgw,
// `kvgw eval --kv-dtype T` computes the same tokens for each T in --kvgw-kv (its raw float32
// logits, [n_tokens][n_vocab], read a row at a time) and the same figures are printed for kvgw's
// runs against kvgw's F32 run, and for kvgw F32 against llama.cpp F32 (the engines' agreement).
// A KV type an engine refuses is reported with its error and skipped.
//
// Speed (--bench): prefill of a --prefill-token prompt in a fresh sequence (batch 512), then
// --decode single tokens generated greedily after it, on --threads threads; wall times measured
// here and llama.cpp's own counters (llama_perf_context) both printed.
//
// Exit status: 0 done, 1 an error (stderr says which), 2 usage, 77 node-llama-cpp is not
// installed (the message says how to install it; ctest maps 77 to SKIPPED).
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const SKIP = 77;

function usage(code) {
    const text = fs.readFileSync(fileURLToPath(import.meta.url), "utf8").split("\n");
    process.stderr.write(text.slice(4, 8).map((l) => l.replace(/^\/\/ ?/, "")).join("\n") + "\n");
    process.exit(code);
}

function parseArgs(argv) {
    const o = {
        model: null, tokens: null, text: null, nTokens: 1024, kv: ["f32", "f16", "f16:fa", "q8_0"],
        top: 10, threads: 2, kvgw: null, kvgwKv: ["f32", "f16", "q8_0"], kvgwGemm: "f32",
        saveTokens: null, bench: false, prefill: 512, decode: 64, json: null,
    };
    const num = (flag, v, lo, hi) => {
        const n = Number(v);
        if (!Number.isInteger(n) || n < lo || n > hi) {
            console.error(`llamacpp_ref: ${flag}: '${v}' is not an integer in ${lo}..${hi}`);
            process.exit(2);
        }
        return n;
    };
    const list = (flag, v) => {
        const l = v.split(",").filter((s) => s !== "");
        for (const t of l) {
            if (!(t in KV_TYPES)) {
                console.error(`llamacpp_ref: ${flag}: '${t}' is not one of ${Object.keys(KV_TYPES)}`);
                process.exit(2);
            }
        }
        if (l.length === 0 || l[0] !== "f32") l.unshift("f32"); // the reference runs first
        return [...new Set(l)];
    };
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        if (a === "-h" || a === "--help") usage(0);
        if (a === "--bench") { o.bench = true; continue; }
        const v = argv[++i];
        if (v === undefined) { console.error(`llamacpp_ref: ${a} needs a value`); usage(2); }
        switch (a) {
        case "--model": o.model = v; break;
        case "--tokens": o.tokens = v; break;
        case "--text": o.text = v; break;
        case "--n-tokens": o.nTokens = num(a, v, 2, 1 << 16); break;
        case "--kv": o.kv = list(a, v); break;
        case "--top": o.top = num(a, v, 2, 100); break;
        case "--threads": o.threads = num(a, v, 1, 256); break;
        case "--kvgw": o.kvgw = v; break;
        case "--kvgw-kv": o.kvgwKv = list(a, v); break;
        case "--kvgw-gemm": o.kvgwGemm = v; break;
        case "--save-tokens": o.saveTokens = v; break;
        case "--prefill": o.prefill = num(a, v, 1, 1 << 16); break;
        case "--decode": o.decode = num(a, v, 1, 1 << 16); break;
        case "--json": o.json = v; break;
        default: console.error(`llamacpp_ref: unknown option ${a}`); usage(2);
        }
    }
    if (o.model === null) { console.error("llamacpp_ref: --model is required"); usage(2); }
    return o;
}

// KV settings: the ggml type node-llama-cpp takes for experimentalKvCache{Key,Value}Type, and
// whether flash attention is on. llama.cpp's flash-attention graph casts an F32 K and V to F16
// before the attention (llama-graph.cpp, build_attn_mha), so a true F32-KV run needs it off;
// a quantized V needs it on. "f16:fa" is the F16 cache through flash attention (llama.cpp's
// default on CPU since flash_attn = auto). kvgw takes the name before the colon.
const KV_TYPES = {
    f32: { type: "F32", fa: false }, f16: { type: "F16", fa: false },
    "f16:fa": { type: "F16", fa: true }, q8_0: { type: "Q8_0", fa: true },
};

async function loadNodeLlamaCpp() {
    const dir = process.env.KVGW_LLAMACPP_DIR ?? here;
    const entry = path.join(dir, "node_modules", "node-llama-cpp", "dist", "index.js");
    if (!fs.existsSync(entry)) {
        console.error(`llamacpp_ref: SKIP: node-llama-cpp is not installed (${entry} missing); ` +
            "install it with scripts/setup-llamacpp.sh");
        process.exit(SKIP);
    }
    // Never compile or download: the prebuilt binaries or nothing.
    process.env.NODE_LLAMA_CPP_SKIP_DOWNLOAD = "true";
    return import(pathToFileURL(entry).href);
}

// The tokens to evaluate: a JSON array of ids, or a text file tokenized by llama.cpp (with the
// model's BOS), or by default this repository's README, cut to --n-tokens.
function chooseTokens(o, model) {
    let toks;
    if (o.tokens !== null) {
        toks = JSON.parse(fs.readFileSync(o.tokens, "utf8"));
        if (!Array.isArray(toks) || toks.length === 0 ||
            !toks.every((t) => Number.isInteger(t) && t >= 0 && t < 1 << 24))
            throw new Error(`${o.tokens}: expected a non-empty JSON array of token ids`);
        return toks;
    }
    const file = o.text ?? path.join(here, "..", "..", "..", "README.md");
    let text = fs.readFileSync(file, "utf8");
    toks = [];
    const bos = model.tokens.bos;
    if (bos !== null && model.tokens.shouldPrependBosToken) toks.push(bos);
    while (toks.length < o.nTokens) toks.push(...model.tokenize(text));
    return toks.slice(0, o.nTokens);
}

// One position's record: the top-N ids with their log-probs, and a map id -> log-prob holding at
// least the top-N and every id the reference runs asked for.
function lpOf(rec, id) {
    const v = rec.lp.get(id);
    if (v === undefined) throw new Error(`internal: token ${id} missing from a position's record`);
    return v;
}

async function llamaRun(nlc, model, toks, kvType, o, want) {
    const ctxSize = Math.ceil((toks.length + 1) / 256) * 256;
    const ctx = await model.createContext({
        contextSize: ctxSize, batchSize: 512, flashAttention: KV_TYPES[kvType].fa,
        threads: o.threads, experimentalKvCacheKeyType: KV_TYPES[kvType].type,
        experimentalKvCacheValueType: KV_TYPES[kvType].type,
    });
    try {
        const got = [ctx.kvCacheKeyType, ctx.kvCacheValueType].map((t) => nlc.GgmlType[t]);
        if (got[0] !== KV_TYPES[kvType].type || got[1] !== KV_TYPES[kvType].type)
            throw new Error(`asked for K and V ${KV_TYPES[kvType].type}, the context has ${got}`);
        if (ctx.flashAttention !== KV_TYPES[kvType].fa)
            throw new Error(`asked for flash attention ${KV_TYPES[kvType].fa}, got ${ctx.flashAttention}`);
        const seq = ctx.getSequence();
        const input = toks.map((t, i) => [t, {
            generateNext: {
                logits: { filter: { tokens: want ? [...want[i]] : [], includeTop: o.top } },
                totalLogitWeight: true,
            },
        }]);
        const res = await seq.controlledEvaluate(input);
        return toks.map((_, i) => {
            const next = res[i]?.next;
            if (next === undefined || next.logits === undefined)
                throw new Error(`no logits for position ${i}`);
            const top = [...next.logits.entries()].sort((a, b) => b[1] - a[1]);
            const logZ = top[0][1] + Math.log(next.totalLogitWeight);
            const lp = new Map(top.map(([id, l]) => [id, l - logZ]));
            return { top: top.slice(0, o.top).map(([id]) => id), lp };
        });
    } finally {
        await ctx.dispose();
    }
}

// kvgw eval's logits for every position, reduced to the same records (log-softmax in float64).
function kvgwRun(o, toks, kvType, want, tmp) {
    const tokFile = path.join(tmp, "tokens.json");
    const out = path.join(tmp, `logits-${kvType}.f32`);
    fs.writeFileSync(tokFile, JSON.stringify(toks));
    try {
        execFileSync(o.kvgw, ["eval", "--model", o.model, "--tokens", tokFile, "--logits", out,
            "--threads", String(o.threads), "--kv-dtype", kvType.split(":")[0], "--gemm", o.kvgwGemm],
        { stdio: ["ignore", "ignore", "pipe"] });
    } catch (e) {
        return { error: String(e.stderr ?? e.message).trim() };
    }
    const fd = fs.openSync(out, "r");
    const size = fs.fstatSync(fd).size;
    const nVocab = size / (4 * toks.length);
    if (!Number.isInteger(nVocab) || nVocab < o.top)
        throw new Error(`${out}: ${size} bytes is not ${toks.length} rows of float32 logits`);
    const rowBytes = nVocab * 4;
    const buf = Buffer.alloc(rowBytes);
    const row = new Float32Array(buf.buffer, buf.byteOffset, nVocab);
    const recs = [];
    for (let i = 0; i < toks.length; i++) {
        fs.readSync(fd, buf, 0, rowBytes, i * rowBytes);
        let max = -Infinity;
        for (let j = 0; j < nVocab; j++) if (row[j] > max) max = row[j];
        let sum = 0;
        for (let j = 0; j < nVocab; j++) sum += Math.exp(row[j] - max);
        const logZ = max + Math.log(sum);
        const order = [];
        for (let j = 0; j < nVocab; j++) {
            if (order.length < o.top || row[j] > row[order[order.length - 1]]) {
                order.push(j);
                order.sort((a, b) => row[b] - row[a]);
                if (order.length > o.top) order.pop();
            }
        }
        const lp = new Map(order.map((j) => [j, row[j] - logZ]));
        if (want) for (const id of want[i]) lp.set(id, row[id] - logZ);
        recs.push({ top: order, lp });
    }
    fs.closeSync(fd);
    fs.rmSync(out);
    return { recs };
}

// The spread of run `a` against reference `ref` over the reference's top-N at every position.
function spread(a, ref) {
    let max = 0, sum = 0, n = 0, agree = 0, nDecisive = 0, agreeDecisive = 0, worst = -1;
    for (let i = 0; i < ref.length; i++) {
        for (const id of ref[i].top) {
            const d = Math.abs(lpOf(a[i], id) - lpOf(ref[i], id));
            if (d > max) { max = d; worst = i; }
            sum += d;
            n++;
        }
        const same = a[i].top[0] === ref[i].top[0];
        agree += same;
        const gap = lpOf(ref[i], ref[i].top[0]) - lpOf(ref[i], ref[i].top[1]);
        if (gap > 0.1) { nDecisive++; agreeDecisive += same; }
    }
    return {
        max_abs_dlogprob: max, mean_abs_dlogprob: sum / n, worst_position: worst,
        top1_agreement: agree / ref.length, decisive_positions: nDecisive,
        top1_agreement_decisive: nDecisive ? agreeDecisive / nDecisive : 1,
    };
}

function printSpread(name, s) {
    console.log(`${name.padEnd(34)} max|d|=${s.max_abs_dlogprob.toExponential(3)} ` +
        `mean|d|=${s.mean_abs_dlogprob.toExponential(3)} top1=${(100 * s.top1_agreement).toFixed(2)}% ` +
        `top1(gap>0.1)=${(100 * s.top1_agreement_decisive).toFixed(2)}% of ${s.decisive_positions} ` +
        `(worst at ${s.worst_position})`);
}

async function bench(llama, model, toks, o, llamaLogs) {
    const ctx = await model.createContext({
        contextSize: Math.ceil((o.prefill + o.decode + 1) / 256) * 256, batchSize: 512,
        flashAttention: true, threads: o.threads, performanceTracking: true,
    });
    try {
        const seq = ctx.getSequence();
        const prompt = [];
        while (prompt.length < o.prefill) prompt.push(...toks);
        prompt.length = o.prefill;
        // The prompt's last token asks for its logits, as a server's prefill does.
        const input = prompt.map((t, i) => i === prompt.length - 1
            ? [t, { generateNext: { token: true } }] : t);
        let t0 = performance.now();
        const res = await seq.controlledEvaluate(input);
        const prefillS = (performance.now() - t0) / 1000;
        let next = res[prompt.length - 1].next.token;
        t0 = performance.now();
        for (let i = 0; i < o.decode; i++) {
            const r = await seq.controlledEvaluate([[next, { generateNext: { token: true } }]]);
            next = r[0].next.token;
        }
        const decodeS = (performance.now() - t0) / 1000;
        llamaLogs.length = 0;
        await ctx.printTimings();
        const perf = llamaLogs.join("");
        const m = (re) => { const x = perf.match(re); return x ? Number(x[1]) : null; };
        return {
            prefill_tokens: o.prefill, decode_tokens: o.decode, threads: o.threads,
            prefill_tokens_per_s: o.prefill / prefillS, decode_tokens_per_s: o.decode / decodeS,
            llama_perf_prompt_tokens_per_s: m(/prompt eval time.*?([\d.]+) tokens per second/),
            llama_perf_eval_tokens_per_s: m(/\beval time.*?runs.*?([\d.]+) tokens per second/),
            llama_perf: perf.trim(),
        };
    } finally {
        await ctx.dispose();
    }
}

async function main() {
    const o = parseArgs(process.argv.slice(2));
    const nlc = await loadNodeLlamaCpp();
    const llamaLogs = [];
    const llama = await nlc.getLlama({
        gpu: false, build: "never", maxThreads: o.threads, logLevel: nlc.LlamaLogLevel.info,
        logger: (level, msg) => {
            llamaLogs.push(msg);
            if (level === nlc.LlamaLogLevel.error || level === nlc.LlamaLogLevel.fatal)
                process.stderr.write(`llama.cpp: ${msg}`);
        },
    });
    let model;
    try {
        model = await llama.loadModel({ modelPath: o.model });
    } catch (e) {
        const said = llamaLogs.filter((l) => /error|fail|missing|key/i.test(l)).join("").trim();
        throw new Error(`llama.cpp refused ${o.model}: ${e.message}\n${said}`);
    }
    const toks = chooseTokens(o, model);
    if (o.saveTokens) fs.writeFileSync(o.saveTokens, JSON.stringify(toks) + "\n");
    const out = {
        model: o.model, llama_cpp: llama.llamaCppRelease ?? null, n_tokens: toks.length,
        top: o.top, threads: o.threads,
    };
    console.log(`model ${o.model}: ${toks.length} tokens, top-${o.top}, ${o.threads} threads, ` +
        `llama.cpp ${out.llama_cpp?.repo}@${out.llama_cpp?.release}`);

    // llama.cpp, F32 KV first: its top-N ids are what every later run reports.
    const runs = {};
    const want = toks.map(() => new Set());
    const addWant = (recs) => recs.forEach((r, i) => r.top.forEach((id) => want[i].add(id)));
    out.llama = {};
    for (const kv of o.kv) {
        try {
            runs[`llama.cpp ${kv}`] = await llamaRun(nlc, model, toks, kv, o, kv === "f32" ? null : want);
        } catch (e) {
            out.llama[kv] = { error: e.message };
            console.log(`llama.cpp kv=${kv}: refused: ${e.message}`);
            if (kv === "f32") throw e;
            continue;
        }
        addWant(runs[`llama.cpp ${kv}`]);
    }
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "llamacpp-ref-"));
    const kvgwKv = [...new Set(o.kvgwKv.map((k) => k.split(":")[0]))];
    out.kvgw = {};
    try {
        if (o.kvgw !== null) {
            for (const kv of kvgwKv) {
                const r = kvgwRun(o, toks, kv, want, tmp);
                if (r.error) {
                    out.kvgw[kv] = { error: r.error };
                    console.log(`kvgw kv=${kv}: refused: ${r.error}`);
                    if (kv === "f32") break;
                    continue;
                }
                runs[`kvgw ${kv}`] = r.recs;
                addWant(r.recs); // later kvgw runs are compared with this one's top-N
            }
        }
    } finally {
        fs.rmSync(tmp, { recursive: true, force: true });
    }

    out.spread = {};
    const cmp = (a, b) => {
        if (!runs[a] || !runs[b]) return;
        const s = spread(runs[a], runs[b]);
        out.spread[`${a} vs ${b}`] = s;
        printSpread(`${a} vs ${b}`, s);
    };
    for (const kv of o.kv) if (kv !== "f32") cmp(`llama.cpp ${kv}`, "llama.cpp f32");
    for (const kv of kvgwKv) if (kv !== "f32") cmp(`kvgw ${kv}`, "kvgw f32");
    cmp("kvgw f32", "llama.cpp f32");
    for (const kv of kvgwKv) if (kv !== "f32") cmp(`kvgw ${kv}`, `llama.cpp ${kv}`);

    if (o.bench) {
        out.bench = await bench(llama, model, toks, o, llamaLogs);
        const b = out.bench;
        console.log(`llama.cpp prefill_tokens_per_s_${b.prefill_tokens}=${b.prefill_tokens_per_s.toFixed(1)} ` +
            `decode_tokens_per_s=${b.decode_tokens_per_s.toFixed(2)} (llama_perf: prompt ` +
            `${b.llama_perf_prompt_tokens_per_s}, eval ${b.llama_perf_eval_tokens_per_s}) threads=${b.threads}`);
    }
    if (o.json) fs.writeFileSync(o.json, JSON.stringify(out, null, 2) + "\n");
    await model.dispose();
    await llama.dispose();
}

main().catch((e) => {
    console.error(`llamacpp_ref: ${e.message}`);
    process.exit(1);
});
