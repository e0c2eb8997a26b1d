// check_gguf.mjs — an independent GGUF reader's view of a file, for kvgw's tests.
//
//   node tests/node/check_gguf.mjs FILE.gguf
//
// Parses FILE with Hugging Face's @huggingface/gguf (a reader that shares no code with kvgw)
// and prints one JSON object: {"version", "tensor_data_offset", "kv": {key: value}, "tensors":
// [{"name", "shape", "dtype", "offset"}]}. Integers (some are BigInt) and floats print as
// decimal strings so nothing is rounded on the way; arrays print as {"len", "first", "last"}.
// test_mkmodel compares this view with kvgw's own reader, field by field.
import { gguf } from "@huggingface/gguf";

const path = process.argv[2];
if (!path) {
    console.error("usage: node check_gguf.mjs FILE.gguf");
    process.exit(2);
}
const str = (v) => (typeof v === "string" ? v : String(v));
const { metadata, tensorInfos, tensorDataOffset } = await gguf(path, { allowLocalFile: true });
const kv = {};
for (const [k, v] of Object.entries(metadata)) {
    if (k === "version" || k === "tensor_count" || k === "kv_count") continue;
    kv[k] = Array.isArray(v)
        ? { len: v.length, first: v.length ? str(v[0]) : null, last: v.length ? str(v[v.length - 1]) : null }
        : str(v);
}
const out = {
    version: Number(metadata.version),
    tensor_count: str(metadata.tensor_count),
    kv_count: str(metadata.kv_count),
    tensor_data_offset: str(tensorDataOffset),
    kv,
    tensors: tensorInfos.map((t) => ({
        name: t.name,
        shape: t.shape.map(str),
        dtype: Number(t.dtype),
        offset: str(t.offset),
    })),
};
process.stdout.write(JSON.stringify(out) + "\n");
