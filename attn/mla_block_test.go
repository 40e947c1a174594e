package attn_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
)

// attnCheckpoint writes a deepseek_v2 checkpoint with MoE and attention
// tensors for layer 0.
func attnCheckpoint(t *testing.T, a moetest.AttnSpec) (string, *moetest.AttnModel) {
	t.Helper()
	dir := t.TempDir()
	am, err := moetest.WriteAttnCheckpoint(dir, a)
	require.NoError(t, err)
	return dir, am
}

func TestMLABlockMatchesReference(t *testing.T) {
	specs := []moetest.AttnSpec{
		{Hidden: 48, Heads: 4, KVLoraRank: 32, Nope: 16, Rope: 8, VDim: 16, Theta: 10000, DType: "F32", Seed: 1},
		{Hidden: 40, Heads: 3, QLoraRank: 24, KVLoraRank: 40, Nope: 8, Rope: 16, VDim: 12, Theta: 10000, Yarn: true, DType: "BF16", Seed: 2},
		{Hidden: 64, Heads: 2, KVLoraRank: 64, Nope: 32, Rope: 64, VDim: 32, Theta: 10000, Yarn: true, DType: "F32", Seed: 3},
		// DeepSeek-V3's FP8 attention: every projection FP8 with its block scales.
		{Hidden: 64, Heads: 2, QLoraRank: 48, KVLoraRank: 32, Nope: 16, Rope: 16, VDim: 16, Theta: 10000, DType: "F8_E4M3", FP8Block: [2]int{16, 16}, Seed: 4},
		{Hidden: 48, Heads: 3, KVLoraRank: 32, Nope: 16, Rope: 8, VDim: 16, Theta: 10000, DType: "F8_E4M3", Seed: 5},
	}
	for i, s := range specs {
		t.Run(fmt.Sprintf("case%d", i), func(t *testing.T) {
			dir, ref := attnCheckpoint(t, s)
			b, err := attn.LoadMLABlock(dir, 0)
			require.NoError(t, err)
			defer b.Close()
			cache, err := attn.NewCache(16, 8, b.RowDim(), kernels.F32)
			require.NoError(t, err)
			const prompt, extra = 21, 3
			x := moetest.Input(uint64(i), prompt+extra, s.Hidden, false)
			want := ref.Forward(x)
			H := s.Hidden
			// Prefill (extend) the prompt as one batch, then decode one token at a time.
			seqs := make([]int, prompt)
			out := make([]float32, prompt*H)
			require.NoError(t, b.Forward(context.Background(), cache, seqs, x[:prompt*H], out))
			require.LessOrEqual(t, moetest.RelErr(out, want[:prompt*H]), 1e-5, "prefill")
			for j := prompt; j < prompt+extra; j++ {
				one := make([]float32, H)
				require.NoError(t, b.Forward(context.Background(), cache, []int{0}, x[j*H:(j+1)*H], one))
				require.LessOrEqual(t, moetest.RelErr(one, want[j*H:(j+1)*H]), 1e-5, "decode position %d", j)
			}
		})
	}
}

func TestLoadMLABlockErrors(t *testing.T) {
	dir, _ := attnCheckpoint(t, moetest.AttnSpec{Hidden: 16, Heads: 2, KVLoraRank: 8, Nope: 4, Rope: 4, VDim: 4, Theta: 10000, DType: "F32", Seed: 1})
	_, err := attn.LoadMLABlock(dir, 3)
	require.ErrorContains(t, err, `missing tensor "model.layers.3.self_attn.q_proj.weight"`)
	_, err = attn.LoadMLABlock(t.TempDir(), 0)
	require.ErrorContains(t, err, "config.json")
}

// TestLoadMLABlockConfig: a config without MLA (another family) and one
// missing an MLA size are named as such.
func TestLoadMLABlockConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(cfg string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644))
	}
	write(`{"model_type": "mixtral", "hidden_size": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 8}`)
	_, err := attn.LoadMLABlock(dir, 0)
	require.ErrorContains(t, err, `(model_type "mixtral") has no kv_lora_rank: MLA attention (DeepSeek-V2/V3's) needs it`)
	write(`{"model_type": "deepseek_v2", "hidden_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
		"kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4}`)
	_, err = attn.LoadMLABlock(dir, 0)
	require.ErrorContains(t, err, "num_attention_heads is missing")
}
