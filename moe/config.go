package moe

import (
	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/format/safetensors"
)

// Config is a model's MoE block: the experts, how tokens are routed to
// them, their activation and biases. Package arch reads it from a
// config.json or a GGUF file's metadata, per family; its Validate checks
// that the routing is well defined.
type Config = arch.MoE

// Scoring turns router logits into expert scores.
type Scoring = arch.Scoring

// Scoring functions.
const (
	Softmax      = arch.Softmax      // softmax over all experts
	Sigmoid      = arch.Sigmoid      // independent sigmoid per expert
	SqrtSoftplus = arch.SqrtSoftplus // sqrt(softplus(logit)) per expert (DeepSeek-V4)
)

// TopKMethod is how the top-k experts are chosen from the scores.
type TopKMethod = arch.TopKMethod

// Expert selection methods (see arch.TopKMethod).
const (
	Greedy             = arch.Greedy
	GroupLimitedGreedy = arch.GroupLimitedGreedy
	NoAuxTC            = arch.NoAuxTC
)

// Quantization is config.json's quantization_config: how a checkpoint's
// quantized weights are stored.
type Quantization = safetensors.Quantization

// LoadConfig reads dir/config.json's MoE block (arch.Load).
func LoadConfig(dir string) (*Config, error) {
	a, err := arch.Load(dir)
	if err != nil {
		return nil, err
	}
	return &a.MoE, nil
}

// ParseConfig reads a config.json's MoE block (arch.Parse).
func ParseConfig(data []byte) (*Config, error) {
	a, err := arch.Parse(data)
	if err != nil {
		return nil, err
	}
	return &a.MoE, nil
}
