// Package gguf reads GGUF files, llama.cpp's format (versions 2 and 3,
// little-endian): Parse checks a header, Open maps one file, OpenModel
// maps a model whether whole or split into shards, and Model.Matrix turns
// a tensor of any ggml block type moex reads (F32, F16, BF16, Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4) into a kernels.Matrix of the
// same values. A file is untrusted input: every count, length, offset,
// dimension and type id is checked before it is used. The package knows
// nothing of model families; which tensors and metadata keys a family
// reads is the caller's.
package gguf

import "errors"

// ErrMalformed: a file that is not well formed or holds what moex cannot
// read; the message names the key, tensor or byte.
var ErrMalformed = errors.New("gguf: malformed file")
