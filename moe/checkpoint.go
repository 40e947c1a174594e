package moe

import (
	"fmt"

	"github.com/moex-project/moex/format/safetensors"
)

// Checkpoint is a Hugging Face checkpoint folder: its config.json read as
// the MoE block's Config, and its safetensors weights (mapped lazily, a
// shard the first time one of its tensors is asked for).
type Checkpoint struct {
	*safetensors.Checkpoint
	Config *Config
}

// OpenCheckpoint reads dir's config.json and its safetensors index. It
// returns an error naming the file when either is missing or malformed.
func OpenCheckpoint(dir string) (*Checkpoint, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	st, err := safetensors.Open(dir, cfg.Quant)
	if err != nil {
		return nil, fmt.Errorf("moe: %w", err)
	}
	return &Checkpoint{Checkpoint: st, Config: cfg}, nil
}

// explainFault is ExplainFault on a checkpoint that may be nil (a layer
// not loaded from one).
func (c *Checkpoint) explainFault(err error) error {
	if c == nil {
		return err
	}
	return c.ExplainFault(err)
}
