// Package tokenizer turns text into a model's token ids and back, id for id
// what Hugging Face's tokenizers give for the same files.
//
// A Tokenizer is read from a model folder's tokenizer.json and
// tokenizer_config.json (Load, or FromJSON for the bytes), or from a GGUF
// file's tokenizer.ggml.* metadata (ReadGGUFVocab, then FromGGUF, which
// follows llama.cpp: a file converted from a Hugging Face model gives that
// model's ids). It runs the pipeline the file describes, in Hugging Face's
// order: added tokens (those not normalized first, on the raw text), the
// normalizer on what is left, the pre-tokenizer, the model (BPE:
// byte-level as in GPT-2, Llama 3, Qwen, DeepSeek and o200k, or
// SentencePiece-style with byte fallback as in Mistral; a GGUF llama
// vocabulary by its scores), then the post-processor that adds the special
// tokens. Where Python transformers departs from the file, it follows
// transformers: a Llama-class tokenizer's post-processor is rebuilt from
// add_bos_token and add_eos_token in tokenizer_config.json, so DeepSeek-V3's
// ids start with its BOS although its tokenizer.json adds none.
//
// Decode maps ids back to text as the file's decoder does, with one U+FFFD
// for each maximal invalid UTF-8 run (byte-level models) or each byte of
// an invalid byte-fallback run, as the Rust library does. A DecodeStream
// hands out text as ids arrive, never half a character, its pieces adding
// up to Decode of all the ids. StopIDs lists the ids that end a generation
// (generation_config.json's eos_token_id and the EOS).
//
// A Tokenizer is immutable after loading and safe for concurrent use by
// many goroutines (a DecodeStream is for one). Bad input — a malformed
// file, a model or component this package does not implement, an unknown
// GGUF pre-tokenizer, an id outside the vocabulary, text that is not UTF-8
// — returns an error naming the problem (errors.Is with ErrFormat,
// ErrUnsupported, ErrUnknownID or ErrInvalidUTF8); nothing panics.
package tokenizer
