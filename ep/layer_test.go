package ep_test

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/moe"
)

var epSpecs = []moetest.Spec{
	{ModelType: "mixtral", Hidden: 24, Experts: 8, TopK: 2, Inter: 20, DType: "BF16", Seed: 41},
	{ModelType: "qwen2_moe", Hidden: 32, Experts: 6, TopK: 3, Inter: 12, SharedInter: 20, NormTopK: true, DType: "F32", Seed: 42},
	{ModelType: "qwen3_moe", Hidden: 20, Experts: 10, TopK: 4, Inter: 16, DType: "F16", Seed: 43},
	{ModelType: "deepseek_v2", Hidden: 32, Experts: 8, TopK: 3, Inter: 8, SharedExperts: 2, Method: "group_limited_greedy",
		Scoring: "softmax", NGroup: 4, TopKGroup: 2, Scaling: 16, NumLayers: 2, Layer: 1, FirstKDense: 1, DType: "BF16", Seed: 44},
	{ModelType: "deepseek_v3", Hidden: 40, Experts: 12, TopK: 4, Inter: 16, SharedExperts: 1, Method: "noaux_tc", Scoring: "sigmoid",
		NGroup: 4, TopKGroup: 2, NormTopK: true, Scaling: 2.5, DType: "BF16", Shards: 3, Seed: 45},
	{ModelType: "deepseek_v3", Hidden: 40, Experts: 12, TopK: 4, Inter: 24, SharedExperts: 1, Method: "noaux_tc", Scoring: "sigmoid",
		NGroup: 4, TopKGroup: 2, NormTopK: true, Scaling: 2.5, DType: "F8_E4M3", FP8Block: [2]int{16, 16}, Seed: 46},
	{ModelType: "qwen3_moe", Hidden: 64, Experts: 10, TopK: 4, Inter: 32, DType: "INT4", Seed: 47},
	{ModelType: "gpt_oss", Hidden: 64, Experts: 9, TopK: 3, Inter: 32, DType: "MXFP4", Seed: 48},
	{ModelType: "gpt_oss", Hidden: 24, Experts: 7, TopK: 2, Inter: 20, DType: "BF16", Seed: 49},
	{ModelType: "qwen3_5_moe", Hidden: 32, Experts: 8, TopK: 3, Inter: 16, SharedInter: 16, DType: "BF16", Shards: 2, Seed: 50},
	{ModelType: "llama4", Hidden: 32, Experts: 8, TopK: 2, Inter: 16, DType: "BF16", Seed: 51},
	{ModelType: "ernie4_5_moe", Hidden: 24, Experts: 8, TopK: 3, Inter: 12, SharedExperts: 2, NumLayers: 2, Layer: 1, FirstKDense: 1, DType: "F32", Seed: 52},
	{ModelType: "minimax_m2", Hidden: 32, Experts: 9, TopK: 3, Inter: 16, DType: "BF16", Seed: 53},
	{ModelType: "step3_text", Hidden: 32, Experts: 9, TopK: 3, Inter: 16, SharedInter: 12, NormTopK: true, NumLayers: 2, Layer: 1, FirstKDense: 1, DType: "BF16", Seed: 54},
	{ModelType: "deepseek_v4", Hidden: 32, Experts: 9, TopK: 3, Inter: 16, SharedExperts: 1, Scaling: 1.5, NumLayers: 2, Layer: 1, HashLayers: 1, Vocab: 20, DType: "BF16", Seed: 55},
	{ModelType: "deepseek_v4", Hidden: 32, Experts: 9, TopK: 3, Inter: 16, SharedExperts: 1, Scaling: 1.5, NumLayers: 2, Layer: 0, HashLayers: 1, Vocab: 20, DType: "F32", Seed: 56},
	{ModelType: "gemma4", Hidden: 32, Experts: 8, TopK: 3, Inter: 16, DenseInter: 20, DType: "BF16", Seed: 57},
	{ModelType: "gemma4", Hidden: 24, Experts: 6, TopK: 2, Inter: 12, DenseInter: 10, NumLayers: 3, Layer: 2, KVShared: 1, DoubleWide: true, TextOnly: true, DType: "F32", Seed: 58},
}

func bitsOf(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, f := range v {
		out[i] = math.Float32bits(f)
	}
	return out
}

// runEP runs the layer over R in-process ranks, the tokens (and their ids,
// nil for none) split as ep.Split does, and returns the outputs in token
// order.
func runEP(t *testing.T, dir string, layer int, x []float32, tokens []int32, H, K int, place *ep.Placement) ([]float32, []int32, []float32, []*moe.Checkpoint) {
	t.Helper()
	R := place.Ranks
	T := len(x) / H
	off := ep.Split(T, R)
	y := make([]float32, len(x))
	ids := make([]int32, T*K)
	w := make([]float32, T*K)
	cks := make([]*moe.Checkpoint, R)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := onRanks(t, R, func(c ep.Comm) error {
		r := c.Rank()
		ck, err := moe.OpenCheckpoint(dir)
		if err != nil {
			c.Abort(err)
			return err
		}
		cks[r] = ck
		l, err := ep.LoadFrom(ck, layer, c, place)
		if err != nil {
			c.Abort(err)
			return err
		}
		l.SetWorkers(1 + r%2)
		lo, hi := off[r], off[r+1]
		var tok []int32
		if tokens != nil {
			tok = tokens[lo:hi]
		}
		return l.ForwardTokens(ctx, x[lo*H:hi*H], tok, y[lo*H:hi*H], ids[lo*K:hi*K], w[lo*K:hi*K])
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	t.Cleanup(func() {
		for _, ck := range cks {
			if ck != nil {
				ck.Close()
			}
		}
	})
	return y, ids, w, cks
}

// TestBitIdenticalToOneRank: every family, EP sizes from 1 to the expert
// count (and beyond), every placement: the same bits as one rank.
func TestBitIdenticalToOneRank(t *testing.T) {
	for _, spec := range epSpecs {
		t.Run(fmt.Sprintf("%s/layer=%d", spec.ModelType, spec.Layer), func(t *testing.T) {
			m, err := moetest.Generate(spec)
			require.NoError(t, err)
			dir := filepath.Join(t.TempDir(), "ckpt")
			require.NoError(t, m.WriteTo(dir))
			H, K, E := spec.Hidden, spec.TopK, spec.Experts
			x := moetest.Input(spec.Seed, 13, H, false)
			single, err := moe.Load(dir, spec.Layer)
			require.NoError(t, err)
			defer single.Close()
			want := make([]float32, len(x))
			wantIDs := make([]int32, 13*K)
			wantW := make([]float32, 13*K)
			var tokens []int32
			if spec.Hash() {
				tokens = moetest.Tokens(spec.Seed, 13, spec.Vocab)
			}
			require.NoError(t, single.ForwardTokens(context.Background(), x, tokens, want, wantIDs, wantW))
			load := make([]int64, E)
			for _, id := range wantIDs {
				load[id]++
			}
			for _, R := range []int{1, 2, 3, 5, E, E + 3} {
				places := map[string]func() (*ep.Placement, error){
					"contiguous":  func() (*ep.Placement, error) { return ep.Contiguous(E, R) },
					"round-robin": func() (*ep.Placement, error) { return ep.RoundRobin(E, R) },
					"balanced":    func() (*ep.Placement, error) { return ep.Balanced(load, R, R) },
				}
				for name, mk := range places {
					t.Run(fmt.Sprintf("ep=%d/%s", R, name), func(t *testing.T) {
						place, err := mk()
						require.NoError(t, err)
						y, ids, w, cks := runEP(t, dir, spec.Layer, x, tokens, H, K, place)
						require.Equal(t, bitsOf(want), bitsOf(y), "outputs")
						require.Equal(t, wantIDs, ids)
						require.Equal(t, bitsOf(wantW), bitsOf(w))
						// No rank touched another rank's expert tensors.
						for r, ck := range cks {
							mine := map[int]bool{}
							for _, e := range place.Local(r) {
								mine[e] = true
							}
							for _, name := range ck.Accessed() {
								if i := strings.Index(name, ".experts."); i >= 0 {
									if c := name[i+len(".experts.")]; c < '0' || c > '9' {
										continue // a fused tensor of all the experts (gpt_oss): a rank reads its experts' slabs of it
									}
									var e int
									_, err := fmt.Sscanf(name[i+len(".experts."):], "%d.", &e)
									require.NoError(t, err)
									require.True(t, mine[e], "rank %d read %s", r, name)
								}
							}
						}
					})
				}
			}
		})
	}
}

func TestEPFaults(t *testing.T) {
	spec := epSpecs[0]
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, m.WriteTo(dir))
	place, err := ep.Contiguous(spec.Experts, 3)
	require.NoError(t, err)
	H := spec.Hidden
	x := moetest.Input(1, 6, H, false)

	t.Run("bad input on one rank", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		errs := onRanks(t, 3, func(c ep.Comm) error {
			l, err := ep.Load(dir, 0, c, place)
			if err != nil {
				c.Abort(err)
				return err
			}
			defer l.Close()
			xr := append([]float32(nil), x[2*c.Rank()*H:2*(c.Rank()+1)*H]...)
			if c.Rank() == 1 {
				xr[3] = float32(math.NaN())
			}
			return l.Forward(ctx, xr, make([]float32, len(xr)))
		})
		require.Less(t, time.Since(start), 5*time.Second)
		require.ErrorContains(t, errs[1], "input token 0 has a non-finite value NaN at column 3")
		require.ErrorIs(t, errs[0], ep.ErrAborted)
		require.ErrorIs(t, errs[2], ep.ErrAborted)
	})
	t.Run("rank never arrives", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		errs := onRanks(t, 3, func(c ep.Comm) error {
			l, err := ep.Load(dir, 0, c, place)
			if err != nil {
				return err
			}
			defer l.Close()
			if c.Rank() == 2 {
				return nil
			}
			return l.Forward(ctx, x[:H], make([]float32, H))
		})
		require.ErrorIs(t, errs[0], context.DeadlineExceeded)
		require.Error(t, errs[1])
	})
	t.Run("placement for another model", func(t *testing.T) {
		other, err := ep.Contiguous(spec.Experts+1, 3)
		require.NoError(t, err)
		errs := onRanks(t, 3, func(c ep.Comm) error {
			_, err := ep.Load(dir, 0, c, other)
			return err
		})
		require.ErrorContains(t, errs[0], "placement is for 9 experts over 3 ranks, the model has 8 experts")
	})
	t.Run("load counts", func(t *testing.T) {
		ctx := context.Background()
		errs := onRanks(t, 3, func(c ep.Comm) error {
			l, err := ep.Load(dir, 0, c, place)
			if err != nil {
				return err
			}
			defer l.Close()
			xr := x[2*c.Rank()*H : 2*(c.Rank()+1)*H]
			for range 2 {
				if err := l.Forward(ctx, xr, make([]float32, len(xr))); err != nil {
					return err
				}
			}
			g, err := l.GlobalExpertLoad(ctx)
			if err != nil {
				return err
			}
			var total int64
			for _, n := range g {
				total += n
			}
			require.EqualValues(t, 2*6*spec.TopK, total)
			return nil
		})
		for _, err := range errs {
			require.NoError(t, err)
		}
	})
	t.Run("forward after close", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		errs := onRanks(t, 3, func(c ep.Comm) error {
			l, err := ep.Load(dir, 0, c, place)
			if err != nil {
				c.Abort(err)
				return err
			}
			xr := x[2*c.Rank()*H : 2*(c.Rank()+1)*H]
			if err := l.Forward(ctx, xr, make([]float32, len(xr))); err != nil {
				return err
			}
			st := l.StageTimes()
			require.Positive(t, st.Dispatch+st.Experts+st.Combine)
			require.NoError(t, l.Close())
			require.NoError(t, l.Close(), "a second Close does nothing")
			return l.Forward(ctx, xr, make([]float32, len(xr)))
		})
		for r, err := range errs {
			require.ErrorIs(t, err, moe.ErrClosed, "rank %d", r)
		}
	})
}
