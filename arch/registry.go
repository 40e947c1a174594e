package arch

import (
	"slices"
	"strings"
)

// family is what one family file defines.
type family struct {
	// name is the family's model_type; aliases are model types whose
	// computation is this family's under another name (their checkpoints
	// use its tensor names); classes are the Hugging Face model classes
	// (config.json's architectures) that name it.
	name             string
	aliases, classes []string
	// textConfig are the model types (the family's or an alias's) whose
	// config.json keeps the text model's keys under text_config.
	textConfig []string
	// topK are the keys of the experts a token takes, in the order tried
	// (nil: num_experts_per_tok, then experts_per_token); topKName the
	// one a message names when none is there.
	topK     []string
	topKName string
	// read takes the family's keys into c; c.Hidden, c.Layers and the
	// common keys are read already.
	read func(c *Config, k *keys) error
	// dense returns nil if layer n (in range) is MoE, else an ErrDenseLayer
	// error saying why; nil: every layer is MoE.
	dense func(c *Config, n int) error
	// names are layer n's MoE tensor names with the decoder under root.
	names func(c *Config, root string, n int) MoENames
	// gguf are the GGUF architectures (general.architecture) llama.cpp
	// converts the family to, and fromGGUF writes the config.json keys
	// their metadata gives into cfg.
	gguf     []string
	fromGGUF func(m *ggufMeta, cfg map[string]any) error
	// whole: moex runs the family's whole model; notWhole says why not.
	// ggufWhole: from a GGUF file too, with ggufNames changing the layer
	// names llama.cpp gives the family where they differ from its
	// llama-like ones.
	whole, ggufWhole bool
	notWhole         string
	ggufNames        func(n *LayerNames)
}

// registry lists the families moex reads, one file each.
var registry = []*family{
	mixtral, qwen2MoE, qwen3MoE, qwen3Next, qwen35MoE, qwen3VLMoE, olmoe,
	deepseekV2, deepseekV3, glm4MoE, dots1, minimaxM2, ernie45MoE, llama4, gptOss,
	deepseekV4, gemma4, step3Text,
}

// byName, byAlias and byClass index the registry.
var byName, byAlias, byClass = func() (n, a, c map[string]*family) {
	n, a, c = map[string]*family{}, map[string]*family{}, map[string]*family{}
	for _, f := range registry {
		n[f.name] = f
		for _, x := range f.aliases {
			a[x] = f
		}
		for _, x := range f.classes {
			c[x] = f
		}
	}
	return n, a, c
}()

// Families lists the supported Hugging Face model_type values.
func Families() []string {
	out := make([]string, len(registry))
	for i, f := range registry {
		out[i] = f.name
	}
	return out
}

// familyOf is the family whose computation model type t is: t itself, an
// alias's, or, for a model type moex does not know, that of its config's
// architectures.
func familyOf(t string, architectures []string) (*family, bool) {
	if f, ok := byName[t]; ok {
		return f, true
	}
	if f, ok := byAlias[t]; ok {
		return f, true
	}
	for _, a := range architectures {
		if f, ok := byClass[a]; ok {
			return f, true
		}
	}
	return nil, false
}

// textConfig reports whether model type t keeps its text model's keys
// under text_config.
func textConfig(t string) bool {
	for _, f := range registry {
		if slices.Contains(f.textConfig, t) {
			return true
		}
	}
	return false
}

// aliasList names the aliases and what they are read as.
func aliasList() string {
	var out []string
	for a, f := range byAlias {
		out = append(out, a+" as "+f.name)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}
