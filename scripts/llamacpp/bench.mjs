// llama.cpp on a GGUF file, through node-llama-cpp's prebuilt CPU libraries,
// for the same-machine comparison (scripts/compare-llamacpp.sh) and the
// GGUF cross-checks (cmd/moex's TestLlamaCppGreedy). Prints one JSON line.
//
//   node bench.mjs bench  F.gguf P N THREADS SEED [B]   pp (P prompt tokens from an empty
//        cache, tokens/s) then tg (N single-token steps right after it, greedy,
//        no stop at end tokens, tokens/s); llama.cpp's defaults otherwise: f16 KV
//        cache, flash attention on, batch 512. With B > 1, B sequences of one
//        context, each with a prompt of its own, evaluated together (node-llama-cpp
//        batches the sequences' pending tokens into one decode): the rates are
//        those of all B, as llama-batched-bench's S_PP and S_TG.
//   node bench.mjs greedy F.gguf IDS N THREADS       the greedy continuation (N tokens)
//        of the prompt IDS (comma-separated token ids).
//   node bench.mjs logits F.gguf P THREADS SEED DIR  P random ids (as bench draws them)
//        into DIR/ids.npy (int32 [P]) and llama.cpp's logits of every position into
//        DIR/llama.npy (float32 [P, vocabulary]), at bench's settings (f16 KV cache, flash
//        attention on).
//   node bench.mjs relerr REF.npy X.npy...            each X's relative error against REF
//        (‖X − REF‖₂ / ‖REF‖₂ over every logit) and the positions whose argmax agrees.
//
// The ids of `bench` are random in [0, vocabulary) from SEED.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {readFileSync, writeFileSync} from "node:fs";

const [mode, path, a, b, c, d, e] = process.argv.slice(2);
if (!["bench", "greedy", "logits", "relerr"].includes(mode) || !path) {
  console.error("usage: node bench.mjs bench F.gguf P N THREADS SEED [B] | greedy F.gguf IDS N THREADS | logits F.gguf P THREADS SEED DIR | relerr REF.npy X.npy...");
  process.exit(2);
}

// npyWrite writes a little-endian .npy file of the typed array v (float32
// or int32) with the given shape.
function npyWrite(file, v, shape) {
  const descr = v instanceof Float32Array ? "<f4" : "<i4";
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': (${shape.join(", ")}${shape.length === 1 ? "," : ""}), }`;
  header += " ".repeat(63 - ((10 + header.length) % 64)) + "\n";
  const pre = Buffer.alloc(10);
  pre.write("\x93NUMPY", 0, "latin1");
  pre[6] = 1;
  pre.writeUInt16LE(header.length, 8);
  writeFileSync(file, Buffer.concat([pre, Buffer.from(header, "latin1"), Buffer.from(v.buffer, v.byteOffset, v.byteLength)]));
}

// npyRead reads a float32 .npy file as written by npyWrite or moex.
function npyRead(file) {
  const buf = readFileSync(file);
  const n = buf.readUInt16LE(8);
  const header = buf.toString("latin1", 10, 10 + n);
  if (!header.includes("'<f4'") || header.includes("'fortran_order': True")) {
    throw new Error(`${file}: want a little-endian float32 C-order .npy, have ${header.trim()}`);
  }
  const shape = header.match(/'shape': \(([^)]*)\)/)[1].split(",").filter((x) => x.trim()).map(Number);
  const data = buf.subarray(10 + n);
  return {shape, v: new Float32Array(data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength))};
}

if (mode === "relerr") {
  const ref = npyRead(path);
  const cols = ref.shape[ref.shape.length - 1];
  const argmax = (v, r) => {
    let best = r * cols;
    for (let i = r * cols; i < (r + 1) * cols; i++) if (v[i] > v[best]) best = i;
    return best - r * cols;
  };
  for (const f of process.argv.slice(4)) {
    const x = npyRead(f);
    if (x.shape.join() !== ref.shape.join()) throw new Error(`${f}: shape ${x.shape}, want ${ref.shape}`);
    let num = 0, den = 0, same = 0;
    for (let i = 0; i < ref.v.length; i++) {
      const e = x.v[i] - ref.v[i];
      num += e * e;
      den += ref.v[i] * ref.v[i];
    }
    const rows = ref.v.length / cols;
    for (let r = 0; r < rows; r++) same += argmax(x.v, r) === argmax(ref.v, r) ? 1 : 0;
    console.log(JSON.stringify({ref: path, file: f, rel_err: Math.sqrt(num / den), argmax_same: same, positions: rows}));
  }
  process.exit(0);
}
const threads = +(mode === "logits" ? b : c) || 2;
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: threads});
const model = await llama.loadModel({modelPath: path});
// Which of ggml's CPU builds the loader chose for this CPU (it picks by
// the CPU's features).
const variant = [...new Set(readFileSync("/proc/self/maps", "utf8").split("\n")
  .filter((l) => l.includes("libggml-cpu")).map((l) => l.split("/").pop()))].join(",");
const vocab = model.fileInfo.metadata.tokenizer.ggml.tokens.length;

async function run(prompt, n) {
  const ctx = await model.createContext({contextSize: prompt.length + n + 1, batchSize: 512, threads, flashAttention: true});
  try {
    const seq = ctx.getSequence();
    let t0 = performance.now();
    await seq.evaluateWithoutGeneratingNewTokens(prompt.slice(0, -1));
    // The prompt's last token is evaluated with the first generated one's
    // step, as llama-bench's pp includes it: its time is the prompt's.
    const out = [];
    const it = seq.evaluate(prompt.slice(-1), {temperature: 0})[Symbol.asyncIterator]();
    const first = await it.next();
    const pp = (performance.now() - t0) / 1000;
    out.push(first.value);
    t0 = performance.now();
    while (out.length < n + 1) {
      const r = await it.next();
      if (r.done) break;
      out.push(r.value);
    }
    await it.return?.();
    const tg = (performance.now() - t0) / 1000;
    return {pp, tg, tokens: out};
  } finally {
    await ctx.dispose();
  }
}

// runBatch is run for B sequences of one context evaluated together:
// their prompts, then N steps of one token each, all B at a time.
async function runBatch(prompts, n) {
  const B = prompts.length;
  const ctx = await model.createContext({contextSize: prompts[0].length + n + 1, sequences: B, batchSize: 512, threads,
    flashAttention: true});
  try {
    const seqs = prompts.map(() => ctx.getSequence());
    let t0 = performance.now();
    await Promise.all(seqs.map((s, i) => s.evaluateWithoutGeneratingNewTokens(prompts[i].slice(0, -1))));
    const its = seqs.map((s, i) => s.evaluate(prompts[i].slice(-1), {temperature: 0})[Symbol.asyncIterator]());
    await Promise.all(its.map((it) => it.next()));
    const pp = (performance.now() - t0) / 1000;
    t0 = performance.now();
    for (let step = 0; step < n; step++) {
      const rs = await Promise.all(its.map((it) => it.next()));
      if (rs.some((r) => r.done)) throw new Error(`a sequence stopped at step ${step}`);
    }
    const tg = (performance.now() - t0) / 1000;
    await Promise.all(its.map((it) => it.return?.()));
    return {pp, tg};
  } finally {
    await ctx.dispose();
  }
}

// randomIDs draws P ids in [0, vocabulary) from seed.
function randomIDs(P, seed) {
  let x = BigInt(+seed || 1);
  return Array.from({length: P}, () => {
    x = (x * 6364136223846793005n + 1442695040888963407n) & ((1n << 64n) - 1n);
    return Number((x >> 33n) % BigInt(vocab));
  });
}

if (mode === "logits") {
  const ids = randomIDs(+a, c);
  const ctx = await model.createContext({contextSize: ids.length + 1, batchSize: 512, threads, flashAttention: true});
  const seq = ctx.getSequence();
  const res = await seq.controlledEvaluate(ids.map((t) => [t, {generateNext: {logits: true}}]));
  const out = new Float32Array(ids.length * vocab);
  res.forEach((r, p) => {
    if (!r?.next?.logits) throw new Error(`llama.cpp gave no logits at position ${p}`);
    for (const [tok, l] of r.next.logits) out[p * vocab + tok] = l;
  });
  await ctx.dispose();
  npyWrite(`${d}/ids.npy`, Int32Array.from(ids), [ids.length]);
  npyWrite(`${d}/llama.npy`, out, [ids.length, vocab]);
  console.log(JSON.stringify({engine: "llama.cpp", variant, threads, positions: ids.length, vocab}));
} else if (mode === "bench") {
  const P = +a, N = +b, B = +e || 1;
  // tg: the N steps after the first generated token's (which is the prompt's).
  const r = B === 1 ? await run(randomIDs(P, d), N) : await runBatch(Array.from({length: B}, (_, i) => randomIDs(P, (+d || 1) * 1000 + i)), N);
  console.log(JSON.stringify({engine: "llama.cpp", variant, threads, batch: B, pp_tokens: P, pp_tokens_s: B * P / r.pp,
    tg_tokens: N, tg_tokens_s: B * N / r.tg}));
} else {
  const ids = a.split(",").map(Number);
  const r = await run(ids, +b - 1);
  console.log(JSON.stringify({engine: "llama.cpp", variant, tokens: r.tokens.slice(0, +b)}));
}
await model.dispose();
await llama.dispose();
