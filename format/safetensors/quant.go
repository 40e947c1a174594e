package safetensors

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/moex-project/moex/format"
	"github.com/moex-project/moex/internal/errkind"
)

// Quantization is how a checkpoint's quantized weights are stored (its
// config.json's quantization_config). Which tensors are quantized is what
// the checkpoint holds: a tensor stored as FP8 is read with its scales,
// the others as they are.
type Quantization struct {
	// Method is quant_method: "fp8" (fine-grained FP8, e4m3 with block
	// scales: DeepSeek-V3, Qwen3-FP8, Kimi-K2-Instruct, MiniMax-M2),
	// "compressed-tensors" in its pack-quantized format with symmetric
	// int4 groups (Kimi-K2-Thinking, K2.5), or "mxfp4" (gpt-oss: the
	// experts' _blocks and _scales).
	Method string
	// BlockRows, BlockCols are fp8's weight_block_size: one scale for each
	// block of [BlockRows, BlockCols] elements of a weight [out, in].
	BlockRows, BlockCols int
	// GroupSize is the int4 scheme's group_size: one scale for each group
	// of GroupSize elements along a weight's row.
	GroupSize int
	// NotConverted and IgnoredLayers are fp8's modules_to_not_convert and
	// ignored_layers: an entry names a module, a module inside it, or the
	// modules whose names end in it ("gate" is every layer's router
	// "model.layers.N.mlp.gate", never a "gate_proj"); a "*" in an entry
	// stands for any run of characters ("model.layers.*.mlp.router",
	// as gpt-oss writes them). Ignore is
	// compressed-tensors' ignore: module names, or "re:" patterns matched
	// from a name's start. A module they name must not be stored quantized.
	NotConverted, IgnoredLayers, Ignore []string
	ignoreRE                            []*regexp.Regexp
}

// Unquantized reports which entry of the quantization_config's lists of
// unquantized modules names module (a tensor name less its ".weight"), if
// any, as "list entry".
func (q *Quantization) Unquantized(module string) (string, bool) {
	if q == nil {
		return "", false
	}
	names := func(e string) bool {
		if strings.Contains(e, "*") {
			return globNames(e, module)
		}
		return e != "" && (module == e || strings.HasPrefix(module, e+".") || strings.HasSuffix(module, "."+e))
	}
	for _, e := range q.NotConverted {
		if names(e) {
			return fmt.Sprintf("modules_to_not_convert %q", e), true
		}
	}
	for _, e := range q.IgnoredLayers {
		if names(e) {
			return fmt.Sprintf("ignored_layers %q", e), true
		}
	}
	j := 0
	for _, e := range q.Ignore {
		if p, ok := strings.CutPrefix(e, "re:"); ok {
			re := q.ignoreRE[j]
			j++
			if re.MatchString(module) {
				return fmt.Sprintf("ignore %q", "re:"+p), true
			}
		} else if module == e {
			return fmt.Sprintf("ignore %q", e), true
		}
	}
	return "", false
}

// globNames reports whether pattern, where "*" is any run of characters,
// names module or a module module is inside.
func globNames(pattern, module string) bool {
	parts := strings.Split(pattern, "*")
	var match func(i int, s string) bool
	match = func(i int, s string) bool {
		if i == len(parts)-1 {
			rest, ok := strings.CutPrefix(s, parts[i])
			return ok && (rest == "" || strings.HasPrefix(rest, "."))
		}
		rest, ok := strings.CutPrefix(s, parts[i])
		if !ok {
			return false
		}
		for j := 0; j <= len(rest); j++ {
			if match(i+1, rest[j:]) {
				return true
			}
		}
		return false
	}
	return match(0, module)
}

// compileIgnore compiles compressed-tensors' "re:" ignore entries, each
// anchored at the name's start as Python's re.match is.
func (q *Quantization) compileIgnore() error {
	for _, e := range q.Ignore {
		if p, ok := strings.CutPrefix(e, "re:"); ok {
			re, err := regexp.Compile(`^(?:` + p + `)`)
			if err != nil {
				return errkind.Errorf(format.ErrUnsupported, "quantization_config.ignore entry %q is not a pattern moex reads: %v", e, err)
			}
			q.ignoreRE = append(q.ignoreRE, re)
		}
	}
	return nil
}

// rawQuant is quantization_config as the checkpoints write it.
type rawQuant struct {
	QuantMethod         string   `json:"quant_method"`
	Fmt                 string   `json:"fmt"`
	WeightBlockSize     []int    `json:"weight_block_size"`
	ActivationScheme    string   `json:"activation_scheme"`
	ModulesToNotConvert []string `json:"modules_to_not_convert"`
	IgnoredLayers       []string `json:"ignored_layers"`
	// compressed-tensors
	Format       string                `json:"format"`
	ConfigGroups map[string]rawCTGroup `json:"config_groups"`
	Ignore       []string              `json:"ignore"`
}

// rawCTGroup is one of compressed-tensors' config_groups.
type rawCTGroup struct {
	Targets []string `json:"targets"`
	Weights *struct {
		NumBits   int    `json:"num_bits"`
		Type      string `json:"type"`
		Symmetric bool   `json:"symmetric"`
		Strategy  string `json:"strategy"`
		GroupSize int    `json:"group_size"`
		Dynamic   bool   `json:"dynamic"`
	} `json:"weights"`
	InputActivations json.RawMessage `json:"input_activations"`
}

// parseCompressedTensors reads a compressed-tensors quantization_config:
// the pack-quantized format with every config group's weights symmetric
// int4 in groups along the row, weight-only. Anything else is an
// format.ErrUnsupported error naming the scheme.
func parseCompressedTensors(raw *rawQuant) (*Quantization, error) {
	if raw.Format != "pack-quantized" {
		return nil, errkind.Errorf(format.ErrUnsupported, "quantization_config: compressed-tensors format %q is not supported (supported: pack-quantized)", raw.Format)
	}
	if len(raw.ConfigGroups) == 0 {
		return nil, errkind.Errorf(format.ErrUnsupported, "quantization_config: compressed-tensors without config_groups")
	}
	q := &Quantization{Method: "compressed-tensors", Ignore: raw.Ignore}
	if err := q.compileIgnore(); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(raw.ConfigGroups))
	for name := range raw.ConfigGroups {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		g := raw.ConfigGroups[name]
		w := g.Weights
		if w == nil {
			return nil, errkind.Errorf(format.ErrUnsupported, "quantization_config.config_groups.%s has no weights scheme", name)
		}
		scheme := fmt.Sprintf("num_bits %d, type %q, symmetric %v, strategy %q, group_size %d", w.NumBits, w.Type, w.Symmetric, w.Strategy, w.GroupSize)
		if w.NumBits != 4 || w.Type != "int" || !w.Symmetric || w.Strategy != "group" || w.GroupSize < 2 || w.GroupSize%2 != 0 || w.Dynamic {
			return nil, errkind.Errorf(format.ErrUnsupported, "quantization_config.config_groups.%s: weights scheme (%s) is not supported (supported: num_bits 4, type \"int\", symmetric, strategy \"group\", an even group_size)", name, scheme)
		}
		if a := strings.TrimSpace(string(g.InputActivations)); a != "" && a != "null" {
			return nil, errkind.Errorf(format.ErrUnsupported, "quantization_config.config_groups.%s quantizes input activations (%s): only weight-only schemes are supported", name, a)
		}
		if q.GroupSize != 0 && q.GroupSize != w.GroupSize {
			return nil, errkind.Errorf(format.ErrUnsupported, "quantization_config: config groups with group sizes %d and %d", q.GroupSize, w.GroupSize)
		}
		q.GroupSize = w.GroupSize
	}
	return q, nil
}

// ParseQuantization reads config.json's quantization_config (the value
// of that key): fine-grained FP8 e4m3 with block scales, compressed-tensors'
// pack-quantized int4, or MXFP4; anything else is a format.ErrUnsupported
// error naming what it holds.
func ParseQuantization(data json.RawMessage) (*Quantization, error) {
	var raw rawQuant
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, errkind.Errorf(format.ErrUnsupported, "quantization_config: %v", err)
	}
	return parseQuant(&raw)
}

func parseQuant(raw *rawQuant) (*Quantization, error) {
	switch raw.QuantMethod {
	case "fp8":
	case "compressed-tensors":
		return parseCompressedTensors(raw)
	case "mxfp4":
		return &Quantization{Method: "mxfp4", NotConverted: raw.ModulesToNotConvert}, nil
	case "":
		return nil, errkind.Errorf(format.ErrUnsupported, "quantization_config has no quant_method (supported: fp8, compressed-tensors, mxfp4)")
	default:
		return nil, errkind.Errorf(format.ErrUnsupported, "quantization_config.quant_method %q is not supported (supported: fp8, compressed-tensors, mxfp4)", raw.QuantMethod)
	}
	if raw.Fmt != "" && raw.Fmt != "e4m3" {
		return nil, errkind.Errorf(format.ErrUnsupported, "quantization_config.fmt %q is not supported (fp8 weights must be e4m3)", raw.Fmt)
	}
	if len(raw.WeightBlockSize) != 2 || raw.WeightBlockSize[0] < 1 || raw.WeightBlockSize[1] < 1 {
		return nil, errkind.Errorf(format.ErrUnsupported, "quantization_config.weight_block_size is %v: fp8 weights need a block size [rows, cols] of positive values", raw.WeightBlockSize)
	}
	q := &Quantization{Method: raw.QuantMethod, BlockRows: raw.WeightBlockSize[0], BlockCols: raw.WeightBlockSize[1]}
	q.NotConverted, q.IgnoredLayers = raw.ModulesToNotConvert, raw.IgnoredLayers
	return q, nil
}
