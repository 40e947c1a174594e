package moe

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/moex-project/moex/format/safetensors"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/internal/regfile"
	"github.com/moex-project/moex/kernels"
)

// Scoring turns router logits into expert scores.
type Scoring uint8

// Scoring functions.
const (
	Softmax      Scoring = iota + 1 // softmax over all experts
	Sigmoid                         // independent sigmoid per expert
	SqrtSoftplus                    // sqrt(softplus(logit)) per expert (DeepSeek-V4)
)

func (s Scoring) String() string {
	switch s {
	case Softmax:
		return "softmax"
	case Sigmoid:
		return "sigmoid"
	case SqrtSoftplus:
		return "sqrtsoftplus"
	}
	return fmt.Sprintf("Scoring(%d)", uint8(s))
}

// TopKMethod is how the top-k experts are chosen from the scores.
type TopKMethod uint8

// Expert selection methods.
const (
	// Greedy takes the k highest scores.
	Greedy TopKMethod = iota + 1
	// GroupLimitedGreedy keeps the TopKGroups groups whose best score is
	// highest, then takes the k highest scores inside them (DeepSeek-V2).
	GroupLimitedGreedy
	// NoAuxTC chooses with scores plus a per-expert correction bias: groups
	// ranked by the sum of their two best biased scores, then the k highest
	// biased scores inside the kept groups; the weights are the unbiased
	// scores (DeepSeek-V3).
	NoAuxTC
)

func (m TopKMethod) String() string {
	switch m {
	case Greedy:
		return "greedy"
	case GroupLimitedGreedy:
		return "group_limited_greedy"
	case NoAuxTC:
		return "noaux_tc"
	}
	return fmt.Sprintf("TopKMethod(%d)", uint8(m))
}

// Families lists the supported Hugging Face model_type values.
var Families = []string{"mixtral", "qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5_moe", "qwen3_vl_moe", "olmoe",
	"deepseek_v2", "deepseek_v3", "glm4_moe", "dots1", "minimax_m2", "ernie4_5_moe", "llama4", "gpt_oss",
	"deepseek_v4", "gemma4", "step3_text"}

// Config is the MoE block of a model, read from its config.json and
// normalised over the families' differing field names and defaults.
type Config struct {
	// ModelType is the family whose block the model computes; Name is
	// config.json's own model_type (kimi_k2 for a ModelType deepseek_v3).
	ModelType  string
	Name       string
	Hidden     int // hidden_size
	NumLayers  int // num_hidden_layers; 0 when the file does not say
	NumExperts int // routed experts
	TopK       int // experts per token
	Inter      int // intermediate width of one routed expert

	// SharedInter is the intermediate width of the shared-expert MLP (DeepSeek:
	// n_shared_experts × moe_intermediate_size, fused as one MLP); 0 for none.
	SharedInter int
	// SharedGate: the shared expert's output is multiplied by
	// sigmoid(shared_expert_gate · x) (qwen2_moe).
	SharedGate bool

	Scoring        Scoring
	Method         TopKMethod
	NumGroups      int     // n_group, for the group-limited methods
	TopKGroups     int     // topk_group
	NormTopK       bool    // renormalise the k weights to sum to one
	NormEps        float64 // added to the renormalisation's denominator (DeepSeek: 1e-20)
	NormMin        float64 // the renormalisation's denominator is at least this (ERNIE: moe_norm_min, 1e-12)
	RoutedScaling  float64 // multiply the final weights by this
	ScoreBiasInput bool    // NoAuxTC: the gate has an e_score_correction_bias tensor
	// ChooseOnLogits: the experts are ranked by their raw logits rather
	// than by their scores (llama4: top-k on the logits, then sigmoid).
	ChooseOnLogits bool
	// WeightOnInput: a chosen expert's routing weight multiplies its input
	// rather than its output, expert(w·x) (llama4).
	WeightOnInput bool

	// RouterBias: the router adds a bias to its logits (gpt_oss's
	// router.bias). ExpertBias: the experts' projections have biases
	// (gpt_oss). Act is the experts' activation (the zero value: SwiGLU).
	RouterBias, ExpertBias bool
	Act                    kernels.Activation
	// SharedAct is the shared expert's activation (the zero value: SwiGLU;
	// gemma4's dense MLP: GeGLU, as its experts).
	SharedAct kernels.Activation

	// HashLayers are the layers that choose their experts by token id,
	// from the checkpoint's tid2eid table [VocabSize, top_k], and weight
	// them by their scores (deepseek_v4's hash_moe layers): their forward
	// passes need the batch's token ids.
	HashLayers []int
	VocabSize  int

	// ResidualInput (gemma4): the block reads the residual stream and owns
	// its norms. The router reads RMSNorm(x) (no weight) × router.scale ×
	// hidden^−½ and multiplies the renormalised weights by per_expert_scale;
	// the experts read pre_feedforward_layernorm_2(x), the dense MLP (the
	// "shared expert", width SharedInter) pre_feedforward_layernorm(x); the
	// block's output is post_feedforward_layernorm(
	// post_feedforward_layernorm_1(mlp) + post_feedforward_layernorm_2(moe)),
	// what the decoder adds to x. RMSNormEps is the norms' epsilon.
	ResidualInput bool
	RMSNormEps    float64
	// DoubleWideFrom > 0 (gemma4's use_double_wide_mlp): from this layer
	// on (the KV-shared layers) the dense MLP is twice SharedInter wide.
	DoubleWideFrom int

	// MLA's cached latent per token and layer (deepseek): kv_lora_rank and
	// qk_rope_head_dim; 0 when the config has none.
	KVLoraRank, RopeDim int

	// Which layers are MoE (the others are dense MLPs).
	FirstKDense   int   // deepseek: first_k_dense_replace
	LayerFreq     int   // deepseek: moe_layer_freq
	SparseStep    int   // qwen: decoder_sparse_step; llama4: interleave_moe_layer_step
	MLPOnlyLayers []int // qwen: mlp_only_layers
	// MoELayers lists the MoE layers where the config names them (llama4's
	// moe_layers); nil otherwise.
	MoELayers []int
	// MoEStart, MoEEnd, MoEInterval (ernie4_5_moe): layer n is MoE when
	// MoEStart ≤ n ≤ MoEEnd and (n+1) % MoEInterval == 0.
	MoEStart, MoEEnd, MoEInterval int
	// MTPLayers are the multi-token-prediction layers a checkpoint stores
	// after the model's (glm4_moe: num_nextn_predict_layers): not model
	// layers.
	MTPLayers int

	// Quant is config.json's quantization_config; nil when there is none.
	Quant *Quantization
}

// rawConfig is config.json as written by the families' Hugging Face
// configuration classes. Pointers tell a missing field from a zero.
type rawConfig struct {
	ModelType              string          `json:"model_type"`
	HiddenSize             *int            `json:"hidden_size"`
	NumHiddenLayers        *int            `json:"num_hidden_layers"`
	NumLocalExperts        *int            `json:"num_local_experts"`
	NumExperts             *int            `json:"num_experts"`
	NRoutedExperts         *int            `json:"n_routed_experts"`
	NumExpertsPerTok       *int            `json:"num_experts_per_tok"`
	ExpertsPerToken        *int            `json:"experts_per_token"`
	SwigluLimit            *float64        `json:"swiglu_limit"`
	IntermediateSize       *int            `json:"intermediate_size"`
	MoEIntermediateSize    *int            `json:"moe_intermediate_size"`
	SharedExpertInterSize  *int            `json:"shared_expert_intermediate_size"`
	NSharedExperts         *int            `json:"n_shared_experts"`
	NormTopKProb           *bool           `json:"norm_topk_prob"`
	DecoderSparseStep      *int            `json:"decoder_sparse_step"`
	MLPOnlyLayers          []int           `json:"mlp_only_layers"`
	TopKMethod             *string         `json:"topk_method"`
	ScoringFunc            *string         `json:"scoring_func"`
	NGroup                 *int            `json:"n_group"`
	TopKGroup              *int            `json:"topk_group"`
	RoutedScalingFactor    *float64        `json:"routed_scaling_factor"`
	FirstKDenseReplace     *int            `json:"first_k_dense_replace"`
	MoELayerFreq           *int            `json:"moe_layer_freq"`
	KVLoraRank             *int            `json:"kv_lora_rank"`
	QKRopeHeadDim          *int            `json:"qk_rope_head_dim"`
	QuantizationConfig     json.RawMessage `json:"quantization_config"`
	UseRoutingBias         *bool           `json:"use_routing_bias"`
	NumNextnPredictLayers  *int            `json:"num_nextn_predict_layers"`
	MoENumExperts          *int            `json:"moe_num_experts"`
	MoEK                   *int            `json:"moe_k"`
	MoENumSharedExperts    *int            `json:"moe_num_shared_experts"`
	MoELayerStartIndex     *int            `json:"moe_layer_start_index"`
	MoELayerEndIndex       *int            `json:"moe_layer_end_index"`
	MoELayerInterval       *int            `json:"moe_layer_interval"`
	MoENormMin             *float64        `json:"moe_norm_min"`
	InterleaveMoELayerStep *int            `json:"interleave_moe_layer_step"`
	MoELayers              []int           `json:"moe_layers"`
	MLPLayerTypes          []string        `json:"mlp_layer_types"`
	NumHashLayers          *int            `json:"num_hash_layers"`
	VocabSize              *int            `json:"vocab_size"`
	TopKExperts            *int            `json:"top_k_experts"`
	EnableMoEBlock         *bool           `json:"enable_moe_block"`
	HiddenActivation       *string         `json:"hidden_activation"`
	RMSNormEps             *float64        `json:"rms_norm_eps"`
	NumKVSharedLayers      *int            `json:"num_kv_shared_layers"`
	UseDoubleWideMLP       *bool           `json:"use_double_wide_mlp"`
	MoETopK                *int            `json:"moe_top_k"`
	ShareExpertDim         *int            `json:"share_expert_dim"`
	NormExpertWeight       *bool           `json:"norm_expert_weight"`
	// MoELayersEnum is step3's: a comma-separated string of the MoE
	// layers (or, as some configs write it, a list).
	MoELayersEnum json.RawMessage `json:"moe_layers_enum"`
	// TextConfig is a multimodal checkpoint's text model (Qwen3.5).
	TextConfig    json.RawMessage `json:"text_config"`
	Architectures []string        `json:"architectures"`
}

// aliases are model types whose MoE block is a supported family's under
// another name (their checkpoints use that family's tensor names).
var aliases = map[string]string{
	"kimi_k2":      "deepseek_v3", // Kimi K2 / K2-Instruct-0905 / K2-Thinking: DeepseekV3ForCausalLM
	"deepseek_v32": "deepseek_v3", // DeepSeek-V3.2: the sparse attention is attention-only
	"llama4_text":  "llama4",      // Llama4ForCausalLM: a text-only Llama 4 checkpoint
	"glm_moe_dsa":  "glm4_moe",    // GLM-5: GLM-4.5's MoE block (the sparse attention is attention-only)
	"kimi_k25":     "deepseek_v3", // Kimi K2.5: K2's text model under text_config
	"gemma4_text":  "gemma4",      // Gemma4ForCausalLM: a text-only Gemma 4 checkpoint
	"step3_vl":     "step3_text",  // Step3-VL: Step3's text model under text_config
}

// architectureFamilies are the Hugging Face model classes of the families,
// for a config.json whose model_type moex does not know.
var architectureFamilies = map[string]string{
	"MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe",
	"Qwen3NextForCausalLM": "qwen3_next", "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
	"DeepseekV32ForCausalLM": "deepseek_v3", "GptOssForCausalLM": "gpt_oss",
	"Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe", "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe",
	"OlmoeForCausalLM": "olmoe", "Glm4MoeForCausalLM": "glm4_moe", "Dots1ForCausalLM": "dots1",
	"MiniMaxM2ForCausalLM": "minimax_m2", "Ernie4_5_MoeForCausalLM": "ernie4_5_moe",
	"Llama4ForConditionalGeneration": "llama4", "Llama4ForCausalLM": "llama4", "GlmMoeDsaForCausalLM": "glm4_moe",
	"DeepseekV4ForCausalLM": "deepseek_v4", "Step3VLForConditionalGeneration": "step3_text", "Step3TextForCausalLM": "step3_text", "Gemma4ForConditionalGeneration": "gemma4", "Gemma4ForCausalLM": "gemma4",
}

// familyOf is the family whose block model type t computes: t itself, an
// alias's, or, for a model type moex does not know, that of its config's
// architectures.
func familyOf(t string, architectures []string) (string, bool) {
	if slices.Contains(Families, t) {
		return t, true
	}
	if f, ok := aliases[t]; ok {
		return f, true
	}
	for _, a := range architectures {
		if f, ok := architectureFamilies[a]; ok {
			return f, true
		}
	}
	return "", false
}

// multimodal are the model types whose config.json keeps the text model's
// fields under text_config.
var multimodal = map[string]bool{"qwen3_5_moe": true, "qwen3_vl_moe": true, "llama4": true, "kimi_k25": true, "gemma4": true, "step3_vl": true}

// aliasList names the aliases and what they are read as.
func aliasList() string {
	var out []string
	for a, f := range aliases {
		out = append(out, a+" as "+f)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// parseScoring reads a scoring_func.
func parseScoring(s string) (Scoring, error) {
	switch s {
	case "softmax":
		return Softmax, nil
	case "sigmoid":
		return Sigmoid, nil
	case "sqrtsoftplus":
		return SqrtSoftplus, nil
	}
	return 0, fmt.Errorf("unknown scoring_func %q (want softmax, sigmoid or sqrtsoftplus)", s)
}

// hashLayers reads deepseek_v4's hash-routed layers: mlp_layer_types
// ("hash_moe" or "moe", one per layer), or else the first num_hash_layers
// (3 when neither is given).
func hashLayers(types []string, n *int, layers int) ([]int, error) {
	if types == nil {
		k := 3
		if n != nil {
			k = *n
		}
		if k < 0 {
			return nil, fmt.Errorf("num_hash_layers %d must not be negative", k)
		}
		if layers > 0 {
			k = min(k, layers)
		}
		out := make([]int, k)
		for i := range out {
			out[i] = i
		}
		return out, nil
	}
	if layers > 0 && len(types) != layers {
		return nil, fmt.Errorf("mlp_layer_types has %d entries, num_hidden_layers is %d", len(types), layers)
	}
	out := []int{}
	for i, t := range types {
		switch t {
		case "hash_moe":
			out = append(out, i)
		case "moe":
		default:
			return nil, fmt.Errorf("mlp_layer_types[%d] is %q (want hash_moe or moe)", i, t)
		}
	}
	return out, nil
}

// layerEnum reads step3's moe_layers_enum: "4,5,6" or [4, 5, 6]; missing,
// every layer but the first.
func layerEnum(raw json.RawMessage, layers int) ([]int, error) {
	if t := strings.TrimSpace(string(raw)); t == "" || t == "null" {
		if layers == 0 {
			return nil, fmt.Errorf("step3 config.json has neither moe_layers_enum nor num_hidden_layers: which layers are MoE is unknown")
		}
		out := make([]int, 0, layers)
		for i := 1; i < layers; i++ {
			out = append(out, i)
		}
		return out, nil
	}
	var list []int
	if err := json.Unmarshal(raw, &list); err == nil {
		return list, nil
	}
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		return nil, fmt.Errorf("moe_layers_enum is %s: want a comma-separated string or a list of layer indices", raw)
	}
	for _, f := range strings.Split(text, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("moe_layers_enum %q: %q is not a layer index", text, f)
		}
		list = append(list, n)
	}
	return list, nil
}

// boolOrMissing is *b as text, or "missing".
func boolOrMissing(b *bool) string {
	if b == nil {
		return "missing"
	}
	return fmt.Sprint(*b)
}

// HashLayer reports whether layer n chooses its experts by token id.
func (c *Config) HashLayer(n int) bool { return slices.Contains(c.HashLayers, n) }

// maxConfigBytes bounds what is read of a config.json (DeepSeek-V3's is
// 2 KB).
const maxConfigBytes = 64 << 20

// isNull reports whether a JSON value is absent or null.
func isNull(v json.RawMessage) bool {
	s := strings.TrimSpace(string(v))
	return s == "" || s == "null"
}

// Quantization is config.json's quantization_config: how a checkpoint's
// quantized weights are stored.
type Quantization = safetensors.Quantization

// LoadConfig reads dir/config.json.
func LoadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, "config.json")
	data, err := regfile.ReadFile(path, maxConfigBytes)
	if err != nil {
		return nil, fmt.Errorf("moe: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig reads a Hugging Face config.json. Fields a family's
// configuration class gives a default take that default when missing; the
// sizes must be present. The result is validated.
func ParseConfig(data []byte) (*Config, error) {
	var raw rawConfig
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("not a valid config.json: %w", err)
	}
	if multimodal[raw.ModelType] {
		if t := strings.TrimSpace(string(raw.TextConfig)); t == "" || t == "null" {
			return nil, fmt.Errorf("%s config.json has no text_config: the text model's fields are not there", raw.ModelType)
		}
		var text rawConfig
		if err := json.Unmarshal(raw.TextConfig, &text); err != nil {
			return nil, fmt.Errorf("%s config.json: text_config: %w", raw.ModelType, err)
		}
		text.ModelType = raw.ModelType // the text model's own (qwen3_5_moe_text) names the same block
		if isNull(text.QuantizationConfig) {
			text.QuantizationConfig = raw.QuantizationConfig
		}
		raw = text
	}
	name := raw.ModelType
	if f, ok := familyOf(raw.ModelType, raw.Architectures); ok {
		raw.ModelType = f
	}
	c := &Config{ModelType: raw.ModelType, Name: name, RoutedScaling: 1, Scoring: Softmax, Method: Greedy}
	r := new(reader)
	c.Hidden = r.need(raw.HiddenSize, "hidden_size")
	c.NumLayers = r.or(raw.NumHiddenLayers, 0)
	if raw.NumHiddenLayers != nil && *raw.NumHiddenLayers <= 0 {
		return nil, fmt.Errorf("num_hidden_layers is %d, must be positive", *raw.NumHiddenLayers)
	}
	if raw.NumExpertsPerTok == nil {
		raw.NumExpertsPerTok = raw.ExpertsPerToken // gpt-oss writes both
	}
	topKName := "num_experts_per_tok"
	if raw.ModelType == "ernie4_5_moe" && raw.MoEK != nil {
		raw.NumExpertsPerTok, topKName = raw.MoEK, "moe_k"
	}
	switch raw.ModelType {
	case "gemma4":
		raw.NumExpertsPerTok, topKName = raw.TopKExperts, "top_k_experts"
	case "step3_text":
		raw.NumExpertsPerTok, topKName = raw.MoETopK, "moe_top_k"
	}
	c.TopK = r.need(raw.NumExpertsPerTok, topKName)
	read, ok := familyReaders[raw.ModelType]
	switch {
	case ok:
		if err := read(c, &raw, r); err != nil {
			return nil, err
		}
	case raw.ModelType == "":
		return nil, errkind.Errorf(ErrUnknownFamily, "config.json has no model_type (supported: %v, and %s)", Families, aliasList())
	default:
		return nil, errkind.Errorf(ErrUnknownFamily, "unknown model_type %q, architectures %v (supported: %v, and %s)", raw.ModelType, raw.Architectures, Families, aliasList())
	}
	if len(r.missing) > 0 {
		return nil, fmt.Errorf("%s config.json is missing %v", raw.ModelType, r.missing)
	}
	if !isNull(raw.QuantizationConfig) {
		var err error
		if c.Quant, err = safetensors.ParseQuantization(raw.QuantizationConfig); err != nil {
			return nil, err
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// reader reads config.json's sizes, noting the ones that are missing.
type reader struct{ missing []string }

// need is *p, or 0 with name noted as missing.
func (r *reader) need(p *int, name string) int {
	if p == nil {
		r.missing = append(r.missing, name)
		return 0
	}
	return *p
}

// or is *p, or def when the field is missing.
func (r *reader) or(p *int, def int) int {
	if p == nil {
		return def
	}
	return *p
}

// readGptOss reads the fields GptOssConfig defines: num_local_experts
// (num_experts an alias), top-k on the biased logits then softmax over the k
// (= softmax, top-k, renormalise), experts with biases and the clamped
// SwiGLU (alpha 1.702, a constant of the model; limit swiglu_limit, 7).
func readGptOss(c *Config, raw *rawConfig, r *reader) error {
	if raw.NumLocalExperts == nil {
		raw.NumLocalExperts = raw.NumExperts
	}
	c.NumExperts = r.need(raw.NumLocalExperts, "num_local_experts")
	c.Inter = r.need(raw.IntermediateSize, "intermediate_size")
	c.NormTopK = true
	c.RouterBias, c.ExpertBias = true, true
	limit := 7.0
	if raw.SwigluLimit != nil {
		limit = *raw.SwigluLimit
	}
	c.Act = kernels.Activation{Kind: kernels.ClampedSwiGLU, Alpha: 1.702, Limit: float32(limit)}
	return nil
}

// readDeepseekV4 reads the fields DeepseekV4Config defines: scores
// sqrt(softplus(logit)) (scoring_func), chosen on score +
// e_score_correction_bias without groups, the unbiased scores of the k
// renormalised (+1e-20, always, as the router does) × routed_scaling_factor;
// the layers mlp_layer_types marks hash_moe (or the first num_hash_layers,
// 3) choose by token id; experts clamp before SiLU at swiglu_limit (10), the
// shared expert (moe_intermediate_size × n_shared_experts wide) does not;
// every layer MoE, the MTP layers stored apart (model.mtp.*).
func readDeepseekV4(c *Config, raw *rawConfig, r *reader) error {
	c.NumExperts = r.need(raw.NRoutedExperts, "n_routed_experts")
	c.Inter = r.need(raw.MoEIntermediateSize, "moe_intermediate_size")
	c.SharedInter = r.or(raw.NSharedExperts, 1) * c.Inter
	c.Scoring, c.Method, c.ScoreBiasInput, c.NumGroups, c.TopKGroups = SqrtSoftplus, NoAuxTC, true, 1, 1
	if raw.ScoringFunc != nil {
		var err error
		if c.Scoring, err = parseScoring(*raw.ScoringFunc); err != nil {
			return err
		}
	}
	c.NormTopK, c.NormEps, c.RoutedScaling = true, 1e-20, 1.5
	if raw.RoutedScalingFactor != nil {
		c.RoutedScaling = *raw.RoutedScalingFactor
	}
	limit := 10.0
	if raw.SwigluLimit != nil {
		limit = *raw.SwigluLimit
	}
	c.Act = kernels.Activation{Kind: kernels.ClampedSiLU, Limit: float32(limit)}
	c.VocabSize = r.or(raw.VocabSize, 129280)
	var err error
	if c.HashLayers, err = hashLayers(raw.MLPLayerTypes, raw.NumHashLayers, c.NumLayers); err != nil {
		return err
	}
	return nil
}

// readStep3 reads the fields Step3TextConfig (SGLang's step3_vl) defines:
// softmax, top-k (moe_top_k), renormalised iff norm_expert_weight; the
// shared expert (share_expert_dim) added unweighted; MoE on the layers
// moe_layers_enum lists (all but layer 0 when it is missing); experts stored
// as one 3-D tensor per projection.
func readStep3(c *Config, raw *rawConfig, r *reader) error {
	c.NumExperts = r.need(raw.MoENumExperts, "moe_num_experts")
	c.Inter = r.need(raw.MoEIntermediateSize, "moe_intermediate_size")
	c.SharedInter = r.need(raw.ShareExpertDim, "share_expert_dim")
	c.NormTopK = raw.NormExpertWeight != nil && *raw.NormExpertWeight
	var err error
	if c.MoELayers, err = layerEnum(raw.MoELayersEnum, c.NumLayers); err != nil {
		return err
	}
	return nil
}

// readGemma4 reads the fields Gemma4TextConfig defines: a MoE block on every
// layer when enable_moe_block, beside the dense MLP (intermediate_size, the
// "shared expert"); softmax, top-k (top_k_experts), renormalised, ×
// per_expert_scale; GeGLU experts and MLP (hidden_activation).
func readGemma4(c *Config, raw *rawConfig, r *reader) error {
	if raw.EnableMoEBlock == nil || !*raw.EnableMoEBlock {
		return errkind.Errorf(ErrDenseLayer, "gemma4 config.json has no MoE block (enable_moe_block is %s): the dense Gemma 4 models are not MoE", boolOrMissing(raw.EnableMoEBlock))
	}
	c.NumExperts = r.need(raw.NumExperts, "num_experts")
	c.Inter = r.need(raw.MoEIntermediateSize, "moe_intermediate_size")
	c.SharedInter = r.need(raw.IntermediateSize, "intermediate_size")
	c.NormTopK, c.ResidualInput = true, true
	c.RMSNormEps = 1e-6
	if raw.RMSNormEps != nil {
		c.RMSNormEps = *raw.RMSNormEps
	}
	act := "gelu_pytorch_tanh"
	if raw.HiddenActivation != nil {
		act = *raw.HiddenActivation
	}
	switch act {
	case "gelu_pytorch_tanh", "gelu_new", "gelu_fast": // GELU's tanh approximation, each
	default:
		return errkind.Errorf(ErrUnsupportedFormat, "gemma4 hidden_activation %q is not supported (supported: gelu_pytorch_tanh, gelu_new, gelu_fast)", act)
	}
	c.Act = kernels.Activation{Kind: kernels.GeGLU}
	c.SharedAct = c.Act
	if kv := r.or(raw.NumKVSharedLayers, 0); raw.UseDoubleWideMLP != nil && *raw.UseDoubleWideMLP && kv > 0 && c.NumLayers-kv > 0 {
		c.DoubleWideFrom = c.NumLayers - kv
	}
	return nil
}

// readMixtral reads the fields MixtralConfig defines: softmax, top-k, always
// renormalised.
func readMixtral(c *Config, raw *rawConfig, r *reader) error {
	c.NumExperts = r.need(raw.NumLocalExperts, "num_local_experts")
	c.Inter = r.need(raw.IntermediateSize, "intermediate_size")
	c.NormTopK = true
	return nil
}

// readOlmoe reads the fields OlmoeConfig defines: softmax, top-k,
// renormalised iff norm_topk_prob (false by default and in the released
// models); every layer MoE.
func readOlmoe(c *Config, raw *rawConfig, r *reader) error {
	c.NumExperts = r.need(raw.NumExperts, "num_experts")
	c.Inter = r.need(raw.IntermediateSize, "intermediate_size")
	c.NormTopK = raw.NormTopKProb != nil && *raw.NormTopKProb
	return nil
}

// readMiniMaxM2 reads the fields MiniMaxM2Config defines: sigmoid scores,
// chosen on score + the routing bias (use_routing_bias, true), no groups,
// the unbiased scores of the k renormalised, no routed scaling, no shared
// expert.
func readMiniMaxM2(c *Config, raw *rawConfig, r *reader) error {
	c.NumExperts = r.need(raw.NumLocalExperts, "num_local_experts")
	c.Inter = r.need(raw.IntermediateSize, "intermediate_size")
	c.Scoring, c.NormTopK = Sigmoid, true
	if raw.ScoringFunc != nil {
		var err error
		if c.Scoring, err = parseScoring(*raw.ScoringFunc); err != nil {
			return err
		}
	}
	if raw.UseRoutingBias == nil || *raw.UseRoutingBias {
		c.Method, c.ScoreBiasInput, c.NumGroups, c.TopKGroups = NoAuxTC, true, 1, 1
	}
	return nil
}

// readErnie reads the fields Ernie4_5_MoeConfig defines: softmax (fp32) over
// all experts, chosen on softmax + moe_statics' correction bias, the
// unbiased softmax of the k divided by max(their sum, moe_norm_min); shared
// experts unweighted; no routed scaling.
func readErnie(c *Config, raw *rawConfig, r *reader) error {
	c.NumExperts = r.need(raw.MoENumExperts, "moe_num_experts")
	c.Inter = r.need(raw.MoEIntermediateSize, "moe_intermediate_size")
	c.SharedInter = r.or(raw.MoENumSharedExperts, 0) * c.Inter
	c.Method, c.ScoreBiasInput, c.NumGroups, c.TopKGroups = NoAuxTC, true, 1, 1
	c.NormTopK, c.NormMin = true, 1e-12
	if raw.MoENormMin != nil {
		c.NormMin = *raw.MoENormMin
	}
	c.MoEStart, c.MoEEnd, c.MoEInterval = r.or(raw.MoELayerStartIndex, 0), r.or(raw.MoELayerEndIndex, -1), r.or(raw.MoELayerInterval, 1)
	if c.MoEEnd < 0 { // to the last layer
		c.MoEEnd = math.MaxInt32
	}
	return nil
}

// readLlama4 reads the fields Llama4TextConfig defines: top-k on the raw
// logits, the weight sigmoid(logit) of a chosen expert multiplies its input;
// a shared expert of the same width on the unscaled input; MoE on the layers
// moe_layers names, or every interleave_moe_layer_step-th.
func readLlama4(c *Config, raw *rawConfig, r *reader) error {
	c.NumExperts = r.need(raw.NumLocalExperts, "num_local_experts")
	c.Inter = r.need(raw.IntermediateSize, "intermediate_size")
	c.Scoring, c.ChooseOnLogits, c.WeightOnInput = Sigmoid, true, true
	c.SharedInter = c.Inter
	c.SparseStep = r.or(raw.InterleaveMoELayerStep, 1)
	c.MoELayers = raw.MoELayers
	return nil
}

// readQwen reads the Qwen families' fields. qwen3_next is
// Qwen2MoeSparseMoeBlock (norm_topk_prob defaults to true there);
// qwen3_5_moe the same block with the renormalisation always on and every
// layer MoE (its config dropped the keys); qwen3_vl_moe's text model is
// qwen3_moe's block, always renormalised.
func readQwen(c *Config, raw *rawConfig, r *reader) error {
	c.NumExperts = r.need(raw.NumExperts, "num_experts")
	c.Inter = r.need(raw.MoEIntermediateSize, "moe_intermediate_size")
	c.NormTopK = raw.NormTopKProb != nil && *raw.NormTopKProb
	if raw.ModelType == "qwen3_next" && raw.NormTopKProb == nil || raw.ModelType == "qwen3_5_moe" || raw.ModelType == "qwen3_vl_moe" {
		c.NormTopK = true // qwen3_vl_moe's router renormalises whatever norm_topk_prob says
	}
	c.SparseStep = r.or(raw.DecoderSparseStep, 1)
	c.MLPOnlyLayers = raw.MLPOnlyLayers
	if raw.ModelType == "qwen3_5_moe" {
		c.SparseStep, c.MLPOnlyLayers = 1, nil
	}
	if raw.ModelType != "qwen3_moe" && raw.ModelType != "qwen3_vl_moe" {
		c.SharedInter = r.need(raw.SharedExpertInterSize, "shared_expert_intermediate_size")
		c.SharedGate = c.SharedInter > 0
	}
	return nil
}

// readDeepSeek reads the DeepSeek block's fields. glm4_moe and dots1 are
// DeepSeek-V3's block (sigmoid, noaux_tc, renormalised + 1e-20, ×
// routed_scaling_factor, shared experts, first_k_dense_replace) with their
// configuration classes' defaults: one group, and glm4_moe's
// multi-token-prediction layers stored after the model's.
func readDeepSeek(c *Config, raw *rawConfig, r *reader) error {
	v3 := raw.ModelType != "deepseek_v2"
	c.NormEps = 1e-20
	c.NumExperts = r.need(raw.NRoutedExperts, "n_routed_experts")
	c.Inter = r.need(raw.MoEIntermediateSize, "moe_intermediate_size")
	shared, firstDense := 0, 0
	if raw.ModelType == "glm4_moe" {
		shared, firstDense = 1, 1
	}
	c.SharedInter = r.or(raw.NSharedExperts, shared) * c.Inter
	c.FirstKDense = r.or(raw.FirstKDenseReplace, firstDense)
	c.KVLoraRank = r.or(raw.KVLoraRank, 0)
	c.RopeDim = r.or(raw.QKRopeHeadDim, 0)
	c.LayerFreq = r.or(raw.MoELayerFreq, 1)
	if raw.ModelType == "glm4_moe" {
		c.MTPLayers = r.or(raw.NumNextnPredictLayers, 0)
	}
	if raw.RoutedScalingFactor != nil {
		c.RoutedScaling = *raw.RoutedScalingFactor
	}
	method, scoring := "greedy", "softmax"
	c.NormTopK = raw.NormTopKProb != nil && *raw.NormTopKProb
	if v3 {
		method, scoring = "noaux_tc", "sigmoid"
		c.NormTopK = raw.NormTopKProb == nil || *raw.NormTopKProb
	}
	if raw.TopKMethod != nil {
		method = *raw.TopKMethod
	}
	if raw.ScoringFunc != nil {
		scoring = *raw.ScoringFunc
	}
	switch method {
	case "greedy":
		c.Method = Greedy
	case "group_limited_greedy":
		c.Method = GroupLimitedGreedy
	case "noaux_tc":
		c.Method = NoAuxTC
		c.ScoreBiasInput = true
	default:
		return fmt.Errorf("unknown topk_method %q (want greedy, group_limited_greedy or noaux_tc)", method)
	}
	var err error
	if c.Scoring, err = parseScoring(scoring); err != nil {
		return err
	}
	if c.Method != Greedy {
		// DeepseekV3Config defaults to 8 groups, 4 kept; V2 has no groups
		// unless told, nor have glm4_moe and dots1.
		defGroups, defKeep := 1, 1
		if raw.ModelType == "deepseek_v3" {
			defGroups, defKeep = 8, 4
		}
		c.NumGroups = r.or(raw.NGroup, defGroups)
		c.TopKGroups = r.or(raw.TopKGroup, min(defKeep, c.NumGroups))
	}
	return nil
}

// familyReaders read each family's fields of config.json into a Config.
var familyReaders = map[string]func(c *Config, raw *rawConfig, r *reader) error{
	"gpt_oss":      readGptOss,
	"deepseek_v4":  readDeepseekV4,
	"step3_text":   readStep3,
	"gemma4":       readGemma4,
	"mixtral":      readMixtral,
	"olmoe":        readOlmoe,
	"minimax_m2":   readMiniMaxM2,
	"ernie4_5_moe": readErnie,
	"llama4":       readLlama4,
	"qwen2_moe":    readQwen,
	"qwen3_moe":    readQwen,
	"qwen3_vl_moe": readQwen,
	"qwen3_next":   readQwen,
	"qwen3_5_moe":  readQwen,
	"deepseek_v2":  readDeepSeek,
	"deepseek_v3":  readDeepSeek,
	"glm4_moe":     readDeepSeek,
	"dots1":        readDeepSeek,
}

// Validate checks that the routing is well defined: positive sizes, top_k
// within the experts, groups that divide the experts and leave enough
// experts to choose from.
func (c *Config) Validate() error {
	if !slices.Contains(Families, c.ModelType) {
		return errkind.Errorf(ErrUnknownFamily, "unknown model_type %q (supported: %v)", c.ModelType, Families)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"hidden_size", c.Hidden}, {"number of experts", c.NumExperts}, {"num_experts_per_tok", c.TopK}, {"expert intermediate size", c.Inter}} {
		if f.v <= 0 {
			return fmt.Errorf("%s is %d, must be positive", f.name, f.v)
		}
	}
	if c.NumLayers < 0 || c.SharedInter < 0 {
		return fmt.Errorf("negative num_hidden_layers or shared expert size")
	}
	if err := c.Act.Validate(); err != nil {
		return fmt.Errorf("swiglu_limit: %w", err)
	}
	if err := c.SharedAct.Validate(); err != nil {
		return fmt.Errorf("shared expert: %w", err)
	}
	if len(c.HashLayers) > 0 && c.VocabSize <= 0 {
		return fmt.Errorf("vocab_size %d must be positive: the hash layers' tid2eid has a row per token id", c.VocabSize)
	}
	if c.ResidualInput && (!(c.RMSNormEps > 0) || math.IsInf(c.RMSNormEps, 0) || c.SharedInter <= 0) {
		return fmt.Errorf("rms_norm_eps %v must be positive and finite, and the dense MLP's width %d positive", c.RMSNormEps, c.SharedInter)
	}
	if c.TopK > c.NumExperts {
		return fmt.Errorf("num_experts_per_tok %d is larger than the %d experts", c.TopK, c.NumExperts)
	}
	if c.Scoring != Softmax && c.Scoring != Sigmoid && c.Scoring != SqrtSoftplus {
		return fmt.Errorf("unknown scoring %v", c.Scoring)
	}
	if !(c.RoutedScaling > 0) || c.RoutedScaling > 1e30 {
		return fmt.Errorf("routed_scaling_factor %v must be positive and finite", c.RoutedScaling)
	}
	switch c.Method {
	case Greedy:
	case GroupLimitedGreedy, NoAuxTC:
		if c.NumGroups <= 0 || c.NumExperts%c.NumGroups != 0 {
			return fmt.Errorf("n_group %d does not divide the %d experts", c.NumGroups, c.NumExperts)
		}
		if c.TopKGroups <= 0 || c.TopKGroups > c.NumGroups {
			return fmt.Errorf("topk_group %d must be between 1 and n_group %d", c.TopKGroups, c.NumGroups)
		}
		if per := c.NumExperts / c.NumGroups; c.TopKGroups*per < c.TopK {
			return fmt.Errorf("topk_group %d × %d experts per group = %d is fewer than num_experts_per_tok %d",
				c.TopKGroups, per, c.TopKGroups*per, c.TopK)
		}
	default:
		return fmt.Errorf("unknown topk method %v", c.Method)
	}
	if strings.HasPrefix(c.ModelType, "qwen") {
		if c.SparseStep <= 0 {
			return fmt.Errorf("decoder_sparse_step %d must be positive", c.SparseStep)
		}
	}
	if c.ModelType == "llama4" && c.MoELayers == nil && c.SparseStep <= 0 {
		return fmt.Errorf("interleave_moe_layer_step %d must be positive", c.SparseStep)
	}
	if c.ModelType == "ernie4_5_moe" && (c.MoEInterval <= 0 || c.MoEStart < 0) {
		return fmt.Errorf("moe_layer_interval %d must be positive and moe_layer_start_index %d not negative", c.MoEInterval, c.MoEStart)
	}
	if !(c.NormMin >= 0) || math.IsInf(c.NormMin, 0) || !(c.NormEps >= 0) || math.IsInf(c.NormEps, 0) {
		return fmt.Errorf("moe_norm_min %v and the renormalisation epsilon %v must be finite and not negative", c.NormMin, c.NormEps)
	}
	if c.MTPLayers < 0 {
		return fmt.Errorf("num_nextn_predict_layers %d must not be negative", c.MTPLayers)
	}
	if deepseekBlock(c.ModelType) {
		if c.LayerFreq <= 0 || c.FirstKDense < 0 {
			return fmt.Errorf("moe_layer_freq %d must be positive and first_k_dense_replace %d not negative", c.LayerFreq, c.FirstKDense)
		}
	}
	return nil
}

// deepseekBlock reports whether family t computes DeepSeek's block.
func deepseekBlock(t string) bool {
	return t == "deepseek_v2" || t == "deepseek_v3" || t == "glm4_moe" || t == "dots1"
}

// CheckMoELayer returns nil if layer n is a MoE block, and otherwise an
// error saying why it is not (out of range, or a dense MLP layer).
func (c *Config) CheckMoELayer(n int) error {
	if c.NumLayers > 0 && n >= c.NumLayers && n < c.NumLayers+c.MTPLayers {
		return fmt.Errorf("layer %d is a multi-token-prediction layer (num_nextn_predict_layers %d, stored after the model's %d layers), not a layer of the model",
			n, c.MTPLayers, c.NumLayers)
	}
	if n < 0 || (c.NumLayers > 0 && n >= c.NumLayers) {
		return fmt.Errorf("layer %d out of range: the model has %d layers", n, c.NumLayers)
	}
	switch c.ModelType {
	case "llama4":
		if c.MoELayers != nil && !slices.Contains(c.MoELayers, n) {
			return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (not in moe_layers %v), not MoE", n, c.MoELayers)
		}
		if c.MoELayers == nil && (n+1)%c.SparseStep != 0 {
			return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (interleave_moe_layer_step %d makes layers %d, %d, … MoE), not MoE",
				n, c.SparseStep, c.SparseStep-1, 2*c.SparseStep-1)
		}
	case "step3_text":
		if !slices.Contains(c.MoELayers, n) {
			return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (not in moe_layers_enum), not MoE", n)
		}
	case "ernie4_5_moe":
		if n < c.MoEStart || n > c.MoEEnd || (n+1)%c.MoEInterval != 0 {
			return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (MoE layers are %d…%d with (n+1) %% moe_layer_interval %d = 0), not MoE",
				n, c.MoEStart, c.MoEEnd, c.MoEInterval)
		}
	case "qwen2_moe", "qwen3_moe", "qwen3_vl_moe", "qwen3_next", "qwen3_5_moe":
		if slices.Contains(c.MLPOnlyLayers, n) {
			return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (in mlp_only_layers), not MoE", n)
		}
		if (n+1)%c.SparseStep != 0 {
			return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (decoder_sparse_step %d makes layers %d, %d, … MoE), not MoE",
				n, c.SparseStep, c.SparseStep-1, 2*c.SparseStep-1)
		}
	case "deepseek_v2", "deepseek_v3", "glm4_moe", "dots1":
		if n < c.FirstKDense {
			return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (below first_k_dense_replace %d), not MoE", n, c.FirstKDense)
		}
		if n%c.LayerFreq != 0 {
			return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (not a multiple of moe_layer_freq %d), not MoE", n, c.LayerFreq)
		}
	}
	return nil
}

// tensorNames are the checkpoint names of one MoE block's tensors.
type tensorNames struct {
	gate, bias string
	biasRows   int    // 1: the correction bias is stored [1, experts] (ernie4_5_moe), 0: [experts]
	routerBias string // gpt_oss: router.bias
	// fused is the prefix of the experts' fused 3-D tensors, stored as
	// layout says; "" for one tensor per expert and projection (expert).
	fused  string
	layout fusedLayout
	expert func(e int) (gate, up, down string)
	shared [3]string // gate, up, down
	// sharedGate: qwen2_moe's sigmoid gate of the shared expert.
	sharedGate string
	// tid2eid: a hash layer's token → experts table (deepseek_v4).
	tid2eid string
	// routerScale, expertScale: gemma4's router.scale [hidden] and
	// per_expert_scale [experts]; norms its block's RMSNorm weights in
	// Norms' order (pre, post1, pre2, post2, post).
	routerScale, expertScale string
	norms                    [5]string
}

// fusedLayout is how a family stores its experts as fused 3-D tensors.
type fusedLayout uint8

const (
	// fusedOI: gate_up_proj [E, 2I, H] (the gate rows, then the up rows)
	// and down_proj [E, H, I], [out, in] (Qwen3.5).
	fusedOI fusedLayout = iota + 1
	// fusedIO: the same transposed, x·W form: gate_up_proj [E, H, 2I] (the
	// gate columns, then the up columns), down_proj [E, I, H] (Qwen3-VL-MoE,
	// Llama 4).
	fusedIO
	// fusedGptOss: gpt-oss's, gate and up interleaved, with biases, MXFP4
	// or x·W form.
	fusedGptOss
	// stacked: one 3-D tensor per projection, gate_proj and up_proj
	// [E, I, H], down_proj [E, H, I] (Step3).
	stacked
)

// roots are where checkpoints keep the decoder's layers: a text model's,
// and a multimodal model's text model (Qwen3.5, Qwen3-VL: model.language_model.;
// Llama 4: language_model.model.).
var roots = []string{"model.", "model.language_model.", "language_model.model."}

// names are the tensor names of layer n's MoE block under the first of
// roots that holds its router.
func (c *Config) names(ck *Checkpoint, layer int) tensorNames {
	for _, r := range roots {
		if n := c.namesUnder(r, layer); ck.Has(n.gate) {
			return n
		}
	}
	return c.namesUnder(roots[0], layer)
}

// namesUnder is names with the decoder under root.
func (c *Config) namesUnder(root string, layer int) tensorNames {
	var n tensorNames
	perExpert := func(p, gate, up, down string) func(e int) (string, string, string) {
		return func(e int) (string, string, string) {
			q := fmt.Sprintf("%sexperts.%d.", p, e)
			return q + gate, q + up, q + down
		}
	}
	switch c.ModelType {
	case "mixtral", "minimax_m2":
		p := fmt.Sprintf("%slayers.%d.block_sparse_moe.", root, layer)
		n.gate, n.bias = p+"gate.weight", p+"e_score_correction_bias"
		n.expert = perExpert(p, "w1.weight", "w3.weight", "w2.weight")
		return n
	case "llama4":
		p := fmt.Sprintf("%slayers.%d.feed_forward.", root, layer)
		n.gate, n.fused, n.layout = p+"router.weight", p+"experts.", fusedIO
		s := p + "shared_expert."
		n.shared = [3]string{s + "gate_proj.weight", s + "up_proj.weight", s + "down_proj.weight"}
		return n
	}
	if c.ModelType == "gemma4" {
		// Gemma4TextDecoderLayer: the router, experts and norms sit on the
		// decoder layer itself, the dense MLP under mlp.
		p := fmt.Sprintf("%slayers.%d.", root, layer)
		n.gate, n.routerScale, n.expertScale = p+"router.proj.weight", p+"router.scale", p+"router.per_expert_scale"
		n.fused, n.layout = p+"experts.", fusedOI
		n.shared = [3]string{p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"}
		for i, norm := range []string{"pre_feedforward_layernorm", "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2",
			"post_feedforward_layernorm_2", "post_feedforward_layernorm"} {
			n.norms[i] = p + norm + ".weight"
		}
		return n
	}
	if c.ModelType == "step3_text" {
		p := fmt.Sprintf("%slayers.%d.", root, layer)
		n.gate, n.fused, n.layout = p+"moe.gate.weight", p+"moe.", stacked
		s := p + "share_expert."
		n.shared = [3]string{s + "gate_proj.weight", s + "up_proj.weight", s + "down_proj.weight"}
		return n
	}
	p := fmt.Sprintf("%slayers.%d.mlp.", root, layer)
	if c.ModelType == "gpt_oss" {
		n.gate, n.routerBias, n.fused, n.layout = p+"router.weight", p+"router.bias", p+"experts.", fusedGptOss
		return n
	}
	n.gate = p + "gate.weight"
	n.bias = p + "gate.e_score_correction_bias"
	if c.ModelType == "ernie4_5_moe" {
		n.bias, n.biasRows = p+"moe_statics.e_score_correction_bias", 1
	}
	n.expert = perExpert(p, "gate_proj.weight", "up_proj.weight", "down_proj.weight")
	switch c.ModelType {
	case "qwen3_5_moe":
		n.fused, n.layout = p+"experts.", fusedOI
	case "deepseek_v4":
		n.fused, n.layout, n.tid2eid = p+"experts.", fusedOI, p+"gate.tid2eid"
	case "qwen3_vl_moe":
		n.fused, n.layout = p+"experts.", fusedIO
	}
	shared := p + "shared_experts."
	if c.ModelType == "qwen2_moe" || c.ModelType == "qwen3_next" || c.ModelType == "qwen3_5_moe" {
		shared = p + "shared_expert."
		n.sharedGate = p + "shared_expert_gate.weight"
	}
	n.shared = [3]string{shared + "gate_proj.weight", shared + "up_proj.weight", shared + "down_proj.weight"}
	return n
}
