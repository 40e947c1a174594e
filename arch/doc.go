// Package arch knows what each model family means: which keys of its
// config.json (at the top level, under text_config or under
// language_model) and of a GGUF file's metadata give which sizes, which
// layers are MoE and which dense, how its MoE block routes, and under
// which names its tensors are stored. It reads a config.json in one place
// (Load, Parse) and a GGUF header's metadata (FromGGUF) into one Config of
// the whole model.
//
// A family is one file (deepseek.go, qwen.go, gpt_oss.go, …): its
// config.json keys and their defaults, its GGUF metadata, its layer plan
// and its tensor names together. registry.go lists the families, their
// aliases and the Hugging Face classes that name them. The shared blocks
// (moe's MoE block, attention, the decoder) read a Config and never switch
// on a family's name. The package does no arithmetic and opens no weights.
package arch
