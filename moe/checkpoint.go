package moe

import (
	"fmt"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/format/safetensors"
)

// Checkpoint is a Hugging Face checkpoint folder: its config.json read as
// the MoE block's Config, and its safetensors weights (mapped lazily, a
// shard the first time one of its tensors is asked for).
type Checkpoint struct {
	*safetensors.Checkpoint
	// Arch is the whole model's config; Config its MoE block (&Arch.MoE).
	Arch   *arch.Config
	Config *Config
}

// OpenCheckpoint reads dir's config.json and its safetensors index. It
// returns an error naming the file when either is missing or malformed.
func OpenCheckpoint(dir string) (*Checkpoint, error) {
	a, err := arch.Load(dir)
	if err != nil {
		return nil, err
	}
	return OpenCheckpointConfig(dir, a)
}

// OpenCheckpointConfig is OpenCheckpoint with dir's config.json already
// read (arch.Load).
func OpenCheckpointConfig(dir string, a *arch.Config) (*Checkpoint, error) {
	st, err := safetensors.Open(dir, a.Quant)
	if err != nil {
		return nil, fmt.Errorf("moe: %w", err)
	}
	return &Checkpoint{Checkpoint: st, Arch: a, Config: &a.MoE}, nil
}

// explainFault is ExplainFault on a checkpoint that may be nil (a layer
// not loaded from one).
func (c *Checkpoint) explainFault(err error) error {
	if c == nil {
		return err
	}
	return c.ExplainFault(err)
}
