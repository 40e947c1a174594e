package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"

	"github.com/moex-project/moex/internal/regfile"
)

// StopIDs are the ids that end a generation for the model in dir: every
// id of generation_config.json's eos_token_id (one id or a list) and the
// tokenizer's EOS, ascending, each once.
func StopIDs(dir string, t *Tokenizer) ([]int32, error) {
	var ids []int32
	if eos, ok := t.EOS(); ok {
		ids = append(ids, eos)
	}
	b, err := regfile.ReadFile(filepath.Join(dir, "generation_config.json"), maxConfigJSON)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("tokenizer: %w", err)
	default:
		var g struct {
			EOS json.RawMessage `json:"eos_token_id"`
		}
		if err := json.Unmarshal(b, &g); err != nil {
			return nil, formatErr("generation_config.json: %v", err)
		}
		more, err := idList(g.EOS)
		if err != nil {
			return nil, formatErr("generation_config.json: eos_token_id: %v", err)
		}
		for _, id := range more {
			if id < 0 || int(id) >= t.VocabSize() {
				return nil, formatErr("generation_config.json: eos_token_id %d is outside the vocabulary of %d tokens", id, t.VocabSize())
			}
		}
		ids = append(ids, more...)
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// idList reads one id or a list of them (null or absent: none).
func idList(raw json.RawMessage) ([]int32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one int32
	if json.Unmarshal(raw, &one) == nil {
		return []int32{one}, nil
	}
	var list []int32
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, errors.New("neither an id nor a list of ids")
	}
	return list, nil
}
