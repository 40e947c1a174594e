#!/usr/bin/env node
// Reference fixtures for each tokenizer.json component the Go tokenizer
// package implements, one small hand-written tokenizer at a time.
//
// Regenerate (from the repository root):
//
//     scripts/tokref/install.sh
//     node scripts/tokref/gen_components.js
//
// Output: testdata/tokenizer/components.jsonl, one line per tokenizer:
//   {"name", "tokenizer": <the tokenizer.json object>,
//    "encode": [{"text", "ids", "ids_no_special"}, ...],
//    "decode": [{"ids", "text", "text_skip_special"}, ...]}
// Every expected value is what Hugging Face's Rust tokenizers (npm
// tokenizers@0.23.2, Tokenizer.fromString) gives for that tokenizer.json.

'use strict';

const fs = require('fs');
const path = require('path');

const HERE = __dirname;
const ROOT = path.resolve(HERE, '..', '..');
const OUT = path.join(ROOT, 'testdata', 'tokenizer', 'components.jsonl');
const tk = require(path.join(HERE, 'node_modules', 'tokenizers'));

// A character vocabulary with a few merges, "[UNK]" for the rest.
const CHARS = Array.from(new Set(Array.from(
  'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?\'"-_()[]<>/\\\t\n▁#éÉèकखाःⅧ你好世界')));
const MERGES = [['h', 'e'], ['l', 'l'], ['he', 'll'], ['hell', 'o'], ['▁', 'h'], ['▁h', 'ello'], ['w', 'o'], ['r', 'l'], ['wo', 'rl'], ['worl', 'd'],
  ['▁', 'w'], ['▁w', 'orld'], ['##', 'o'], ['t', 'h'], ['th', 'e']];

function vocabOf(extra) {
  const vocab = { '[UNK]': 0 };
  for (const c of CHARS) vocab[c] = Object.keys(vocab).length;
  for (const t of extra || []) if (!(t in vocab)) vocab[t] = Object.keys(vocab).length;
  for (const [a, b] of MERGES) if (!((a + b) in vocab)) vocab[a + b] = Object.keys(vocab).length;
  for (const [a, b] of MERGES) for (const x of [a, b]) if (!(x in vocab)) vocab[x] = Object.keys(vocab).length;
  return vocab;
}

function tokenizer(o) {
  const vocab = vocabOf(o.extraVocab);
  const model = Object.assign({ type: 'BPE', dropout: null, unk_token: '[UNK]', continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: MERGES.map(([a, b]) => a + ' ' + b) }, o.model || {});
  if (o.byteVocab) {
    for (let b = 0; b < 256; b++) {
      const name = '<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>';
      if (o.byteVocab(b) && !(name in vocab)) vocab[name] = Object.keys(vocab).length;
    }
  }
  let next = Object.keys(vocab).length;
  const added = (o.added || []).map((a) => Object.assign({ id: next++, single_word: false, lstrip: false, rstrip: false, normalized: false, special: false }, a));
  return { version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: o.normalizer || null,
    pre_tokenizer: o.pre || null, post_processor: o.post || null, decoder: o.decoder || null, model };
}

const TEXTS = ['Hello  world', ' leading space', 'trailing  ', 'a1b22c333d4444', "don't STOP!", 'x,y;z...', 'café ÉCOLE è',
  'कः खा', 'xⅧy', '你好 世界', '<mask> text <mask>', 'the <mask>the', 'abc[SEP]def', 'tabs\tand\nnewlines', '   ', '', 'hello world hello',
  'e\u0301 ke\u0301'];

const split = (pattern, behavior, invert) => ({ type: 'Split', pattern, behavior, invert });
const CASES = [
  // Pre-tokenizers.
  { name: 'metaspace_always_split', pre: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true },
    decoder: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true } },
  { name: 'metaspace_first_nosplit', pre: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: false },
    decoder: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: false },
    added: [{ content: '<mask>', special: true }] },
  { name: 'metaspace_never', pre: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'never', split: true },
    decoder: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'never', split: true } },
  { name: 'whitespace', pre: { type: 'Whitespace' } },
  { name: 'whitespace_split', pre: { type: 'WhitespaceSplit' } },
  { name: 'punctuation_isolated', pre: { type: 'Punctuation', behavior: 'Isolated' } },
  { name: 'punctuation_merged_next', pre: { type: 'Punctuation', behavior: 'MergedWithNext' } },
  { name: 'digits_individual', pre: { type: 'Digits', individual_digits: true } },
  { name: 'digits_runs', pre: { type: 'Digits', individual_digits: false } },
  { name: 'bytelevel_prefix_regex', pre: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true }, bytelevel: true },
  ...['Removed', 'Isolated', 'MergedWithPrevious', 'MergedWithNext', 'Contiguous'].flatMap((b) => [false, true].flatMap((inv) => [
    { name: `split_string_${b}_${inv}`, pre: split({ String: ' ' }, b, inv) },
    { name: `split_regex_${b}_${inv}`, pre: split({ Regex: '\\s+|[0-9]' }, b, inv) },
  ])),
  { name: 'sequence_pre', pre: { type: 'Sequence', pretokenizers: [{ type: 'WhitespaceSplit' }, { type: 'Digits', individual_digits: true }, { type: 'Punctuation', behavior: 'Isolated' }] } },
  // Added tokens and their flags.
  { name: 'added_lstrip_rstrip', pre: { type: 'WhitespaceSplit' },
    added: [{ content: '<mask>', special: true, lstrip: true, rstrip: true }, { content: '[SEP]', special: true }] },
  { name: 'added_single_word', pre: { type: 'WhitespaceSplit' },
    added: [{ content: 'the', single_word: true }, { content: 'abc', single_word: true }] },
  { name: 'added_normalized', normalizer: { type: 'Lowercase' },
    added: [{ content: 'stop', normalized: true }, { content: 'HELLO', normalized: false }, { content: '<mask>', special: true }] },
  // Normalizers.
  { name: 'nfd_strip_accents', normalizer: { type: 'Sequence', normalizers: [{ type: 'NFD' }, { type: 'StripAccents' }] } },
  { name: 'nfkc_lowercase', normalizer: { type: 'Sequence', normalizers: [{ type: 'NFKC' }, { type: 'Lowercase' }] } },
  { name: 'nfc', normalizer: { type: 'NFC' } },
  { name: 'strip_prepend', normalizer: { type: 'Sequence', normalizers: [{ type: 'Strip', strip_left: true, strip_right: true }, { type: 'Prepend', prepend: '▁' }] } },
  { name: 'replace_regex', normalizer: { type: 'Replace', pattern: { Regex: '[0-9]+' }, content: '#' } },
  { name: 'replace_string_spaces', normalizer: { type: 'Replace', pattern: { String: ' ' }, content: '▁' },
    decoder: { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 1 }] } },
  // Post-processors.
  { name: 'bert', pre: { type: 'WhitespaceSplit' }, added: [{ content: '[CLS]', special: true }, { content: '[SEP]', special: true }],
    post: { type: 'BertProcessing', sep: ['[SEP]', -2], cls: ['[CLS]', -1] } },
  { name: 'roberta', pre: { type: 'WhitespaceSplit' }, added: [{ content: '<s>', special: true }, { content: '</s>', special: true }],
    post: { type: 'RobertaProcessing', sep: ['</s>', -2], cls: ['<s>', -1], trim_offsets: true, add_prefix_space: false } },
  { name: 'template_bos_eos', pre: { type: 'WhitespaceSplit' }, added: [{ content: '<s>', special: true }, { content: '</s>', special: true }],
    post: { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } }],
      pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<s>': { id: '<s>', ids: [-1], tokens: ['<s>'] }, '</s>': { id: '</s>', ids: [-2], tokens: ['</s>'] } } } },
  // BPE options.
  { name: 'byte_fallback', model: { byte_fallback: true }, byteVocab: (b) => true,
    decoder: { type: 'Sequence', decoders: [{ type: 'ByteFallback' }, { type: 'Fuse' }] } },
  { name: 'fuse_unk_partial_bytes', model: { byte_fallback: true, fuse_unk: true }, byteVocab: (b) => b !== 0xA8 && b !== 0xA2 },
  { name: 'subword_prefix', model: { continuing_subword_prefix: '##', merges: ['h ##e', 'w ##o', 'he ##l', 'l ##o'] }, pre: { type: 'WhitespaceSplit' },
    extraVocab: ['##a', '##b', '##c', '##d', '##e', '##l', '##o', '##r', '##t', '##s', '##p', '##i', '##w', '##n', 'he', 'wo', 'hel', 'lo'] },
  { name: 'ignore_merges', model: { ignore_merges: true }, pre: { type: 'WhitespaceSplit' }, extraVocab: ['world'] },
];

function fixIds(t) {
  // Post-processors name their special tokens by negative placeholders
  // (-1, -2): the ids of the added tokens in order.
  const addedIds = t.added_tokens.map((a) => a.id);
  const fix = (id) => (id < 0 ? addedIds[-id - 1] : id);
  const p = t.post_processor;
  if (!p) return;
  if (p.sep) p.sep[1] = fix(p.sep[1]);
  if (p.cls) p.cls[1] = fix(p.cls[1]);
  if (p.special_tokens) for (const k of Object.keys(p.special_tokens)) p.special_tokens[k].ids = p.special_tokens[k].ids.map(fix);
}

async function main() {
  const lines = [];
  for (const c of CASES) {
    const t = tokenizer(c);
    fixIds(t);
    if (c.bytelevel) {
      // A byte-level vocabulary: GPT-2's 256 characters.
      const chars = [];
      let n = 0;
      for (let b = 0; b < 256; b++) {
        const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        chars.push(String.fromCodePoint(printable ? b : 256 + n++));
      }
      const vocab = {};
      for (const ch of chars) vocab[ch] = Object.keys(vocab).length;
      for (const m of ['Ġ w', 'Ġw o', 'h e']) {
        const [a, b] = m.split(' ');
        vocab[a + b] = Object.keys(vocab).length;
      }
      t.model = Object.assign(t.model, { vocab, merges: ['Ġ w', 'Ġw o', 'h e'], unk_token: null });
    }
    const json = JSON.stringify(t);
    const tok = tk.Tokenizer.fromString(json);
    const encode = [];
    const decode = [];
    for (const text of TEXTS) {
      const ids = Array.from((await tok.encode(text, null, { addSpecialTokens: true })).getIds());
      const noSpecial = Array.from((await tok.encode(text, null, { addSpecialTokens: false })).getIds());
      encode.push({ text, ids, ids_no_special: noSpecial });
      if (noSpecial.length > 0) {
        decode.push({ ids, text: await tok.decode(ids, false), text_skip_special: await tok.decode(ids, true) });
      }
    }
    if (c.byteVocab) {
      const id = (b) => t.model.vocab['<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>'];
      for (const seq of [[0xe4, 0xbd, 0xa0], [0xe4, 0xbd], [0x7d, 0xf4], [0x41, 0xc3]]) {
        const ids = seq.map(id).filter((x) => x !== undefined);
        decode.push({ ids, text: await tok.decode(ids, false), text_skip_special: await tok.decode(ids, true) });
      }
    }
    lines.push(JSON.stringify({ name: c.name, tokenizer: t, encode, decode }));
  }
  fs.writeFileSync(OUT, lines.join('\n') + '\n');
  process.stdout.write(`${path.relative(ROOT, OUT)}: ${lines.length} tokenizers\n`);
}

main().catch((err) => { process.stderr.write((err && err.stack) || String(err)); process.exit(1); });
