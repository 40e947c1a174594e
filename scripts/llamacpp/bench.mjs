// llama.cpp on a GGUF file, through node-llama-cpp's prebuilt CPU libraries,
// for the same-machine comparison (scripts/compare-llamacpp.sh) and the
// GGUF cross-checks (cmd/moex's TestLlamaCppGreedy). Prints one JSON line.
//
//   node bench.mjs bench  F.gguf P N THREADS SEED   pp (P prompt tokens from an empty
//        cache, tokens/s) then tg (N single-token steps right after it, greedy,
//        no stop at end tokens, tokens/s); llama.cpp's defaults otherwise: f16 KV
//        cache, flash attention on, batch 512.
//   node bench.mjs greedy F.gguf IDS N THREADS       the greedy continuation (N tokens)
//        of the prompt IDS (comma-separated token ids).
//
// The ids of `bench` are random in [0, vocabulary) from SEED.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {readFileSync} from "node:fs";

const [mode, path, a, b, c, d] = process.argv.slice(2);
if (!["bench", "greedy"].includes(mode) || !path) {
  console.error("usage: node bench.mjs bench F.gguf P N THREADS SEED | greedy F.gguf IDS N THREADS");
  process.exit(2);
}
const threads = +c || 2;
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

if (mode === "bench") {
  const P = +a, N = +b;
  let x = BigInt(+d || 1);
  const ids = Array.from({length: P}, () => {
    x = (x * 6364136223846793005n + 1442695040888963407n) & ((1n << 64n) - 1n);
    return Number((x >> 33n) % BigInt(vocab));
  });
  const r = await run(ids, N);
  // tg: the N steps after the first generated token's (which is the prompt's).
  console.log(JSON.stringify({engine: "llama.cpp", variant, threads, pp_tokens: P, pp_tokens_s: P / r.pp,
    tg_tokens: N, tg_tokens_s: N / r.tg}));
} else {
  const ids = a.split(",").map(Number);
  const r = await run(ids, +b - 1);
  console.log(JSON.stringify({engine: "llama.cpp", variant, tokens: r.tokens.slice(0, +b)}));
}
await model.dispose();
await llama.dispose();
