package model_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/model"
)

// wholeSpecs: a DeepSeek-V2-style model (q_proj, softmax greedy routing,
// two shared experts, a dense first layer) in F32 and a DeepSeek-V3-style
// one (q-LoRA, yarn RoPE, sigmoid noaux_tc with groups, one shared expert)
// in BF16.
func wholeSpecs() map[string]moetest.WholeSpec {
	return map[string]moetest.WholeSpec{
		"deepseek_v2_f32": {
			MoE: moetest.Spec{ModelType: "deepseek_v2", Experts: 8, TopK: 2, Inter: 16, SharedExperts: 2, Method: "greedy",
				Scoring: "softmax", NGroup: 1, TopKGroup: 1, DType: "F32"},
			Attn:   moetest.AttnSpec{Heads: 4, KVLoraRank: 16, Nope: 8, Rope: 4, VDim: 8, Theta: 10000},
			Hidden: 32, Layers: 3, FirstKDense: 1, Vocab: 50, DenseInter: 40, Seed: 1,
		},
		"deepseek_v3_bf16": {
			MoE: moetest.Spec{ModelType: "deepseek_v3", Experts: 16, TopK: 4, Inter: 8, SharedExperts: 1, Method: "noaux_tc",
				Scoring: "sigmoid", NGroup: 4, TopKGroup: 2, NormTopK: true, Scaling: 2.5, DType: "BF16"},
			Attn:   moetest.AttnSpec{Heads: 2, QLoraRank: 12, KVLoraRank: 16, Nope: 8, Rope: 8, VDim: 8, Theta: 10000, Yarn: true},
			Hidden: 24, Layers: 3, FirstKDense: 1, Vocab: 37, DenseInter: 20, Seed: 2,
		},
	}
}

// TestPrefillMatchesReference: every position's logits within 1e-4 of the
// float64 whole-model reference, and the same argmax.
func TestPrefillMatchesReference(t *testing.T) {
	for name, spec := range wholeSpecs() {
		t.Run(name, func(t *testing.T) {
			w, m := loadWhole(t, spec, nil)
			require.Equal(t, spec.Layers, m.NumLayers())
			ids := moetest.Tokens(3, 19, spec.Vocab)
			got, _ := prefillMatchesReference(t, w, m, ids, spec.Vocab)
			// A prefix's logits are the same: causal, and no token's bits
			// depend on the tokens after it.
			head, err := m.Prefill(context.Background(), ids[:7])
			require.NoError(t, err)
			require.Equal(t, got[:7*spec.Vocab], head)
		})
	}
}

// prefillMatchesReference: m's prefill of ids within 1e-4 of w's float64
// logits, the same argmax at every position; it gives both, flattened.
func prefillMatchesReference(t *testing.T, w *moetest.Whole, m *model.Model, ids []int32, vocab int) (got []float32, want []float64) {
	t.Helper()
	got, err := m.Prefill(context.Background(), ids)
	require.NoError(t, err)
	rows := w.Logits(ids)
	for _, row := range rows {
		want = append(want, row...)
	}
	require.Less(t, moetest.RelErr(got, want), 1e-4)
	for p, row := range rows {
		require.Equal(t, argmax64(row), argmax32(got[p*vocab:(p+1)*vocab]), "position %d", p)
	}
	return got, want
}

func TestLoadErrors(t *testing.T) {
	spec := wholeSpecs()["deepseek_v2_f32"]
	_, m := loadWhole(t, spec, nil)
	_, err := m.Prefill(context.Background(), []int32{1, 50})
	require.EqualError(t, err, "model: token 1 is id 50, outside the vocabulary [0, 50)")
	_, err = m.Prefill(context.Background(), nil)
	require.EqualError(t, err, "model: prefill of no tokens")

	for _, tt := range []struct {
		name   string
		change func(w *moetest.Whole)
		want   string
	}{
		{"no vocab_size", func(w *moetest.Whole) { delete(w.Config, "vocab_size") }, "vocab_size is missing"},
		{"vocab_size 0", func(w *moetest.Whole) { w.Config["vocab_size"] = 0 }, "vocab_size is 0, must be positive"},
		{"a family without its whole model", func(w *moetest.Whole) {
			w.Config["model_type"] = "qwen3_next"
			w.Config["num_experts"], w.Config["shared_expert_intermediate_size"] = 8, 16
		}, `model_type "qwen3_next" (read as qwen3_next): moex runs its MoE block, not yet its whole model: three of its four layers attend by gated DeltaNet`},
		{"no lm_head", func(w *moetest.Whole) { w.Tensors = w.Tensors[:len(w.Tensors)-1] }, `missing tensor "lm_head.weight"`},
		{"no dense width", func(w *moetest.Whole) { delete(w.Config, "intermediate_size") }, "layer 0: intermediate_size is 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w, err := moetest.GenerateWhole(spec)
			require.NoError(t, err)
			tt.change(w)
			dir := t.TempDir()
			require.NoError(t, w.WriteTo(dir))
			_, err = model.Load(dir)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// loadWhole generates spec's model, changes it (nil: not), writes it and
// loads it; the model is closed when the test ends.
func loadWhole(t *testing.T, spec moetest.WholeSpec, change func(*moetest.Whole)) (*moetest.Whole, *model.Model) {
	t.Helper()
	w, err := moetest.GenerateWhole(spec)
	require.NoError(t, err)
	if change != nil {
		change(w)
	}
	dir := t.TempDir()
	require.NoError(t, w.WriteTo(dir))
	m, err := model.Load(dir)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return w, m
}

func argmax64(v []float64) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

func argmax32(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] || math.IsNaN(float64(x)) {
			best = i
		}
	}
	return best
}

// TestTinyPreset: the random preset prefills with finite logits, the same
// for the same seed, others for another seed, and a prefix's logits are
// the whole prompt's first rows.
func TestTinyPreset(t *testing.T) {
	p := model.Tiny()
	a, err := model.NewRandom(p, 1)
	require.NoError(t, err)
	b, err := model.NewRandom(p, 1)
	require.NoError(t, err)
	c, err := model.NewRandom(p, 2)
	require.NoError(t, err)
	ids := moetest.Tokens(5, 40, model.ByteVocab)
	la, err := a.Prefill(context.Background(), ids)
	require.NoError(t, err)
	require.Len(t, la, 40*model.ByteVocab)
	lb, err := b.Prefill(context.Background(), ids)
	require.NoError(t, err)
	require.Equal(t, la, lb)
	lc, err := c.Prefill(context.Background(), ids)
	require.NoError(t, err)
	require.NotEqual(t, la, lc)
	head, err := a.Prefill(context.Background(), ids[:9])
	require.NoError(t, err)
	require.Equal(t, la[:9*model.ByteVocab], head)
	p.FirstKDense = 3
	_, err = model.NewRandom(p, 1)
	require.ErrorContains(t, err, `model: preset "tiny": vocab 260, 3 layers (3 dense of width 128)`)
}

// TestForwardBatchesSequences: three sequences, their prompts in chunks
// and then decode tokens, interleaved in shared calls over a bf16 KV whose
// blocks they share, give every token the logits a prefill of its sequence
// alone gives it (the same bits on an F32 KV: here bf16 rows, so against a
// prefill over a bf16 KV); a step the blocks cannot hold fails before any
// work and leaves the caches as they were.
func TestForwardBatchesSequences(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 3)
	require.NoError(t, err)
	V := model.ByteVocab
	prompts := [][]int32{moetest.Tokens(1, 21, V), moetest.Tokens(2, 5, V), moetest.Tokens(3, 34, V)}
	alone := func(ids []int32) []float32 { return prefillAlone(t, m, ids, kernels.BF16) }
	kv, err := m.NewKV(16, 8, kernels.BF16)
	require.NoError(t, err)
	got := make([][]float32, 3)
	pos := make([]int, 3)
	for step := 0; pos[0] < 21 || pos[1] < 5 || pos[2] < 34; step++ {
		var seqs []int
		var ids []int32
		for s, p := range prompts {
			n := min(len(p)-pos[s], 1+(step+s)%7) // chunks of 1…7 tokens
			for i := 0; i < n; i++ {
				seqs = append(seqs, s)
				ids = append(ids, p[pos[s]+i])
			}
			pos[s] += n
		}
		logits, err := m.Forward(context.Background(), kv, seqs, ids, nil)
		require.NoError(t, err)
		for i, s := range seqs {
			got[s] = append(got[s], logits[i*V:(i+1)*V]...)
		}
	}
	for s, p := range prompts {
		require.Equal(t, alone(p), got[s], "sequence %d", s)
		require.Equal(t, len(p), kv.Len(s))
	}
	// Only the rows asked for.
	last, err := m.Forward(context.Background(), kv, []int{0, 2}, []int32{7, 9}, []int{1})
	require.NoError(t, err)
	require.Len(t, last, V)
	require.Equal(t, alone(append(append([]int32(nil), prompts[2]...), 9))[34*V:], last)

	// 128 rows of blocks, 22 + 5 + 35 held in 3 + 1 + 5 blocks: 7 free.
	free := kv.FreeBlocks()
	big := make([]int32, 8*free+1)
	fresh := make([]int, len(big))
	for i := range fresh {
		fresh[i] = 5 // a new sequence: free+1 blocks
	}
	_, err = m.Forward(context.Background(), kv, fresh, big, nil)
	require.ErrorIs(t, err, attn.ErrCacheExhausted)
	require.ErrorContains(t, err, fmt.Sprintf("model: the step needs %d more cache blocks, %d of 16 are free", free+1, free))
	require.Equal(t, free, kv.FreeBlocks())
	require.Equal(t, 0, kv.Len(5))
	require.Equal(t, 22, kv.Len(0))
	// A bad id refuses the call and changes nothing.
	_, err = m.Forward(context.Background(), kv, []int{1}, []int32{-1}, nil)
	require.ErrorContains(t, err, "token 0 is id -1")
	require.Equal(t, 5, kv.Len(1))
	require.NoError(t, kv.Free(1))
	require.Equal(t, 0, kv.Len(1))
}

// TestSharedPrefix: sequences attached to another's shared blocks (a
// prefix cache hit) and computing only their own suffixes, in one call,
// get the logits a whole prefill of their tokens gets; the shared blocks
// outlive the sequence that wrote them and are free once released.
func TestSharedPrefix(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 9)
	require.NoError(t, err)
	V := model.ByteVocab
	prefix := moetest.Tokens(4, 35, V)
	alone := func(ids []int32) []float32 { return prefillAlone(t, m, ids, kernels.BF16) }
	kv, err := m.NewKV(16, 8, kernels.BF16)
	require.NoError(t, err)
	_, err = m.Forward(context.Background(), kv, make([]int, len(prefix)), prefix, nil)
	require.NoError(t, err)
	_, err = kv.Share(0, 0, 5)
	require.ErrorContains(t, err, "sharing blocks [0, 5) of sequence 0: it holds 4 whole blocks")
	shared, err := kv.Share(0, 0, 4) // 32 tokens
	require.NoError(t, err)
	require.Equal(t, 4, shared.Len())
	require.NoError(t, kv.Free(0))
	require.Equal(t, 16-4, kv.FreeBlocks())

	a := append(append([]int32(nil), prefix[:32]...), moetest.Tokens(5, 6, V)...)
	b := append(append([]int32(nil), prefix[:16]...), moetest.Tokens(6, 3, V)...)
	require.NoError(t, kv.Attach(1, shared))
	require.NoError(t, kv.Attach(2, shared.Slice(0, 2)))
	require.Equal(t, 32, kv.Len(1))
	require.Equal(t, 16, kv.Len(2))
	seqs := []int{1, 1, 1, 1, 1, 1, 2, 2, 2}
	ids := append(append([]int32(nil), a[32:]...), b[16:]...)
	got, err := m.Forward(context.Background(), kv, seqs, ids, nil)
	require.NoError(t, err)
	wantA, wantB := alone(a)[32*V:], alone(b)[16*V:]
	require.Equal(t, wantA, got[:6*V], "a's suffix over the shared rows")
	require.Equal(t, wantB, got[6*V:], "b's suffix over the first two shared blocks")

	require.NoError(t, kv.Free(1))
	require.NoError(t, kv.Free(2))
	require.Equal(t, 16-4, kv.FreeBlocks(), "the shared blocks are still held")
	require.NoError(t, kv.Release(shared))
	require.Equal(t, 16, kv.FreeBlocks())
	require.ErrorContains(t, kv.Release(shared), "model: layer 0: attn: releasing: block")
	require.ErrorContains(t, kv.Attach(3, shared), "model: layer 0: attn: attaching to sequence 3: block")
	require.Equal(t, 0, kv.Len(3))
}

// prefillAlone is the logits of every position of ids, prefilled alone on
// fresh caches of dtype.
func prefillAlone(t *testing.T, m *model.Model, ids []int32, dtype kernels.DType) []float32 {
	kv, err := m.NewKV(8, 8, dtype)
	require.NoError(t, err)
	l, err := m.Forward(context.Background(), kv, make([]int, len(ids)), ids, nil)
	require.NoError(t, err)
	return l
}

// TestTiedEmbeddings: with tie_word_embeddings the logits are the
// embedding's, as transformers ties lm_head to it, whatever lm_head.weight
// the checkpoint holds.
func TestTiedEmbeddings(t *testing.T) {
	for _, spec := range []moetest.WholeSpec{wholeSpecs()["deepseek_v2_f32"], gqaSpecs()["qwen3_moe_f32"]} {
		w, m := loadWhole(t, spec, func(w *moetest.Whole) { w.Config["tie_word_embeddings"] = true })
		ids := moetest.Tokens(6, 9, spec.Vocab)
		got, err := m.Prefill(context.Background(), ids)
		require.NoError(t, err)
		w.LMHead = w.Embed
		var flat []float64
		for _, row := range w.Logits(ids) {
			flat = append(flat, row...)
		}
		require.Less(t, moetest.RelErr(got, flat), 1e-4, spec.MoE.ModelType)
	}
}
