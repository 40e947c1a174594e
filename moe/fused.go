package moe

import (
	"fmt"
	"math"

	"github.com/moex-project/moex/format"
	"github.com/moex-project/moex/format/safetensors"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/kernels"
)

// gpt-oss stores a layer's experts as fused 3-D tensors, E matrices at a
// known stride, its gate and up projections interleaved (row or column 2n
// is gate n, 2n+1 up n), in one of two layouts:
//
//   - MXFP4, as released: gate_up_proj_blocks U8 [E, 2I, H/32, 16] with
//     gate_up_proj_scales U8 [E, 2I, H/32] (E8M0), down_proj_blocks
//     [E, H, I/32, 16] with down_proj_scales [E, H, I/32]: [out, in]
//     matrices, blocks along the input;
//   - F32/BF16/F16 (Hugging Face's GptOssExperts parameters, x·W form):
//     gate_up_proj [E, H, 2I] and down_proj [E, I, H].
//
// and biases gate_up_proj_bias [E, 2I] (interleaved too) and down_proj_bias
// [E, H] in either. An expert's down projection in MXFP4 is read in place;
// its gate and up rows are split into two matrices (a copy in MXFP4, packed
// at once where the kernels pack), and the dense layout is packed straight
// from its rows where the kernels pack (kernels.PackStrided), transposed
// into [out, in] matrices elsewhere, in its stored dtype: never widened.

// slabOf is matrix e of the tensor's E: its bytes.
func slabOf(t safetensors.Tensor, e int) []byte {
	n := len(t.Data) / t.Shape[0]
	return t.Data[e*n : (e+1)*n]
}

// gptOssExperts loads the routed experts keep reports true for (all when
// keep is nil) from the fused tensors under prefix p.
func gptOssExperts(ck *Checkpoint, p string, keep func(e int) bool) ([]Expert, error) {
	cfg := ck.Config
	H, I, E := cfg.Hidden, cfg.Inter, cfg.NumExperts
	gub, err := ck.Matrix(p+"gate_up_proj_bias", E, 2*I)
	if err != nil {
		return nil, err
	}
	db, err := ck.Matrix(p+"down_proj_bias", E, H)
	if err != nil {
		return nil, err
	}
	var load func(e int, x *Expert) error
	if ck.Has(p + "gate_up_proj_blocks") {
		load, err = gptOssMXFP4(ck, p)
	} else {
		load, err = gptOssDense(ck, p)
	}
	if err != nil {
		return nil, err
	}
	row := make([]float32, 2*I)
	return eachExpert(E, keep, func(e int, x *Expert) error {
		if err := load(e, x); err != nil {
			return err
		}
		gub.RowF32(e, row)
		x.GateBias, x.UpBias = make([]float32, I), make([]float32, I)
		for n := 0; n < I; n++ {
			x.GateBias[n], x.UpBias[n] = row[2*n], row[2*n+1]
		}
		x.DownBias = make([]float32, H)
		db.RowF32(e, x.DownBias)
		for _, b := range []struct {
			name string
			v    []float32
			col  func(n int) int
		}{
			{"gate_up_proj_bias", x.GateBias, func(n int) int { return 2 * n }},
			{"gate_up_proj_bias", x.UpBias, func(n int) int { return 2*n + 1 }},
			{"down_proj_bias", x.DownBias, func(n int) int { return n }},
		} {
			for n, v := range b.v {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					return errkind.Errorf(ErrNonFinite, "moe: checkpoint %s: tensor %q [%d, %d] is %v", ck.Dir, p+b.name, e, b.col(n), v)
				}
			}
		}
		if kernels.PacksWeights() {
			// The split gate and up are copies already (packed already
			// from the dense layout): pack them now rather than holding
			// both copies until New packs.
			x.Gate, x.Up = kernels.Pack(x.Gate), kernels.Pack(x.Up)
		}
		return nil
	})
}

// eachExpert makes the experts [E] that keep reports true for (all when
// keep is nil), each filled by load; the others stay empty (not held).
func eachExpert(E int, keep func(e int) bool, load func(e int, x *Expert) error) ([]Expert, error) {
	experts := make([]Expert, E)
	for e := range experts {
		if keep != nil && !keep(e) {
			continue
		}
		if err := load(e, &experts[e]); err != nil {
			return nil, err
		}
	}
	return experts, nil
}

// gptOssMXFP4 reads gpt-oss's MXFP4 experts under prefix p.
func gptOssMXFP4(ck *Checkpoint, p string) (func(e int, x *Expert) error, error) {
	cfg := ck.Config
	H, I, E := cfg.Hidden, cfg.Inter, cfg.NumExperts
	if q := ck.Quant; q == nil || q.Method != "mxfp4" {
		return nil, errkind.Errorf(ErrUnsupportedFormat, "moe: checkpoint %s: tensor %q holds MXFP4 blocks but config.json has no mxfp4 quantization_config", ck.Dir, p+"gate_up_proj_blocks")
	}
	if H%32 != 0 || I%32 != 0 {
		return nil, errkind.Errorf(ErrShape, "moe: checkpoint %s: MXFP4 experts need hidden_size %d and intermediate_size %d to be multiples of 32", ck.Dir, H, I)
	}
	for _, m := range []string{"gate_up_proj", "down_proj"} {
		if err := ck.CheckQuantizable(p+m, "MXFP4 ("+p+m+"_blocks)"); err != nil {
			return nil, err
		}
	}
	gu, err := ck.Raw(p+"gate_up_proj_blocks", []int{E, 2 * I, H / 32, 16}, "U8")
	if err != nil {
		return nil, err
	}
	gus, err := ck.Raw(p+"gate_up_proj_scales", []int{E, 2 * I, H / 32}, "U8")
	if err != nil {
		return nil, fmt.Errorf("%w (the scales of %s)", err, gu.Name)
	}
	d, err := ck.Raw(p+"down_proj_blocks", []int{E, H, I / 32, 16}, "U8")
	if err != nil {
		return nil, err
	}
	ds, err := ck.Raw(p+"down_proj_scales", []int{E, H, I / 32}, "U8")
	if err != nil {
		return nil, fmt.Errorf("%w (the scales of %s)", err, d.Name)
	}
	return func(e int, x *Expert) error {
		blocks, scales := slabOf(gu, e), slabOf(gus, e)
		rb, rs := H/2, H/32 // bytes of a row's blocks and scales
		split := func(odd int) (kernels.Matrix, error) {
			b, s := make([]uint8, I*rb), make([]uint8, I*rs)
			for n := 0; n < I; n++ {
				r := 2*n + odd
				copy(b[n*rb:][:rb], blocks[r*rb:][:rb])
				copy(s[n*rs:][:rs], scales[r*rs:][:rs])
			}
			m, err := kernels.NewMXFP4(I, H, b, s)
			if err != nil {
				return m, errkind.Errorf(ErrUnsupportedFormat, "moe: %s: tensor %q of expert %d: %w", gus.Path, gus.Name, e, err)
			}
			return m, nil
		}
		var err error
		if x.Gate, err = split(0); err != nil {
			return err
		}
		if x.Up, err = split(1); err != nil {
			return err
		}
		if x.Down, err = kernels.NewMXFP4(H, I, slabOf(d, e), slabOf(ds, e)); err != nil {
			return errkind.Errorf(ErrUnsupportedFormat, "moe: %s: tensor %q of expert %d: %w", ds.Path, ds.Name, e, err)
		}
		return nil
	}, nil
}

// gptOssDense reads gpt-oss's unquantized experts under prefix p, in x·W
// form: gate_up_proj [E, H, 2I] with gate and up interleaved (even columns
// gate, odd up), down_proj [E, I, H].
func gptOssDense(ck *Checkpoint, p string) (func(e int, x *Expert) error, error) {
	return xwExperts(ck, p, 0, 1, 2)
}

// xwExperts reads fused experts in x·W form under prefix p: gate_up_proj
// [E, H, 2I] whose gate columns are gateFirst + step·n and up columns
// upFirst + step·n, and down_proj [E, I, H]. Each expert's matrices are
// in the stored dtype, packed from the slabs' rows where the kernels pack
// (the packed panels are copies of every layout), transposed copies
// elsewhere (the generic kernels read [out, in] rows).
func xwExperts(ck *Checkpoint, p string, gateFirst, upFirst, step int) (func(e int, x *Expert) error, error) {
	cfg := ck.Config
	H, I, E := cfg.Hidden, cfg.Inter, cfg.NumExperts
	gu, err := ck.Raw(p+"gate_up_proj", []int{E, H, 2 * I}, "F32", "BF16", "F16")
	if err != nil {
		return nil, err
	}
	d, err := ck.Raw(p+"down_proj", []int{E, I, H}, gu.DType)
	if err != nil {
		return nil, err
	}
	return func(e int, x *Expert) error {
		var err error
		if kernels.PacksWeights() {
			// Packed straight from the x·W slabs: each panel's k step is
			// a run of one of their rows, nothing transposed in between.
			var w, dw kernels.Matrix
			if w, err = slabMatrix(gu, e, H, 2*I); err != nil {
				return err
			}
			if dw, err = slabMatrix(d, e, I, H); err != nil {
				return err
			}
			if x.Gate, err = kernels.PackStrided(w, gateFirst, step, I); err != nil {
				return err
			}
			if x.Up, err = kernels.PackStrided(w, upFirst, step, I); err != nil {
				return err
			}
			x.Down, err = kernels.PackStrided(dw, 0, 1, H)
			return err
		}
		// gate[n][k] = W[k][gateFirst+step·n], up[n][k] = W[k][upFirst+step·n],
		// down[n][k] = D[k][n].
		if x.Gate, err = transposed(gu, e, I, H, 2*I, gateFirst, step); err != nil {
			return err
		}
		if x.Up, err = transposed(gu, e, I, H, 2*I, upFirst, step); err != nil {
			return err
		}
		x.Down, err = transposed(d, e, H, I, H, 0, 1)
		return err
	}, nil
}

// slabMatrix is expert e's slab of t as the row-major matrix [rows, cols]
// it is, a view in t's dtype.
func slabMatrix(t safetensors.Tensor, e, rows, cols int) (kernels.Matrix, error) {
	if m, ok, err := safetensors.Dense(t.DType, rows, cols, slabOf(t, e)); ok {
		return m, err
	}
	return kernels.Matrix{}, errkind.Errorf(ErrUnsupportedFormat, "moe: %s: tensor %q has dtype %s", t.Path, t.Name, t.DType)
}

// fusedExpertsIO loads the routed experts keep reports true for (all when
// keep is nil) from fused tensors in x·W form under prefix p (Qwen3-VL-MoE,
// Llama 4): gate_up_proj [E, H, 2I], the gate columns first, then the up
// columns, and down_proj [E, I, H]; see xwExperts.
func fusedExpertsIO(ck *Checkpoint, p string, keep func(e int) bool) ([]Expert, error) {
	load, err := xwExperts(ck, p, 0, ck.Config.Inter, 1)
	if err != nil {
		return nil, err
	}
	return eachExpert(ck.Config.NumExperts, keep, func(e int, x *Expert) error {
		if err := load(e, x); err != nil {
			return err
		}
		return nil // packed already where the kernels pack
	})
}

// transposed is the matrix [rows, cols] m[n][k] = W[k][first + step·n] of
// expert e's slab W [cols, width] of t, in t's dtype.
func transposed(t safetensors.Tensor, e, rows, cols, width, first, step int) (kernels.Matrix, error) {
	slab := slabOf(t, e)
	switch t.DType {
	case "F32":
		src := format.Cast[float32](slab)
		return kernels.NewF32(rows, cols, gatherT(src, rows, cols, width, first, step))
	case "BF16", "F16":
		src := format.Cast[uint16](slab)
		dt := kernels.BF16
		if t.DType == "F16" {
			dt = kernels.F16
		}
		return kernels.NewHalf(dt, rows, cols, gatherT(src, rows, cols, width, first, step))
	}
	return kernels.Matrix{}, errkind.Errorf(ErrUnsupportedFormat, "moe: %s: tensor %q has dtype %s", t.Path, t.Name, t.DType)
}

func gatherT[T float32 | uint16](src []T, rows, cols, width, first, step int) []T {
	out := make([]T, rows*cols)
	for k := 0; k < cols; k++ {
		in := src[k*width:][:width]
		for n := 0; n < rows; n++ {
			out[n*cols+k] = in[first+step*n]
		}
	}
	return out
}

// fusedExperts loads the routed experts keep reports true for (all when
// keep is nil) from fused tensors in [out, in] form under prefix p
// (Qwen3.5): gate_up_proj [E, 2I, H], the gate rows first, then the up
// rows, and down_proj [E, H, I], in F32, BF16 or F16; each expert's
// matrices are views of the mapped tensors.
func fusedExperts(ck *Checkpoint, p string, keep func(e int) bool) ([]Expert, error) {
	cfg := ck.Config
	H, I, E := cfg.Hidden, cfg.Inter, cfg.NumExperts
	gu, err := ck.Raw(p+"gate_up_proj", []int{E, 2 * I, H}, "F32", "BF16", "F16")
	if err != nil {
		return nil, err
	}
	d, err := ck.Raw(p+"down_proj", []int{E, H, I}, gu.DType)
	if err != nil {
		return nil, err
	}
	return viewExperts(E, keep, gu.DType, func(e int) (gate, up, down []byte) {
		slab := slabOf(gu, e)
		return slab[:len(slab)/2], slab[len(slab)/2:], slabOf(d, e)
	}, H, I)
}

// stackedExperts loads the routed experts keep reports true for (all when
// keep is nil) from one 3-D tensor per projection under prefix p (Step3):
// gate_proj and up_proj [E, I, H], down_proj [E, H, I], in F32, BF16 or
// F16; each expert's matrices are views of the mapped tensors.
func stackedExperts(ck *Checkpoint, p string, keep func(e int) bool) ([]Expert, error) {
	cfg := ck.Config
	H, I, E := cfg.Hidden, cfg.Inter, cfg.NumExperts
	g, err := ck.Raw(p+"gate_proj.weight", []int{E, I, H}, "F32", "BF16", "F16")
	if err != nil {
		return nil, err
	}
	u, err := ck.Raw(p+"up_proj.weight", []int{E, I, H}, g.DType)
	if err != nil {
		return nil, err
	}
	d, err := ck.Raw(p+"down_proj.weight", []int{E, H, I}, g.DType)
	if err != nil {
		return nil, err
	}
	return viewExperts(E, keep, g.DType, func(e int) (gate, up, down []byte) { return slabOf(g, e), slabOf(u, e), slabOf(d, e) }, H, I)
}

// viewExperts makes the experts keep reports true for (all when keep is
// nil) as views of their matrices' bytes in dtype: gate and up [I, H], down
// [H, I].
func viewExperts(E int, keep func(e int) bool, dtype string, slabs func(e int) (gate, up, down []byte), H, I int) ([]Expert, error) {
	view := func(b []byte, rows, cols int) (kernels.Matrix, error) {
		switch dtype {
		case "F32":
			return kernels.NewF32(rows, cols, format.Cast[float32](b))
		case "F16":
			return kernels.NewHalf(kernels.F16, rows, cols, format.Cast[uint16](b))
		}
		return kernels.NewHalf(kernels.BF16, rows, cols, format.Cast[uint16](b))
	}
	return eachExpert(E, keep, func(e int, x *Expert) error {
		g, u, d := slabs(e)
		var err error
		if x.Gate, err = view(g, I, H); err != nil {
			return err
		}
		if x.Up, err = view(u, I, H); err != nil {
			return err
		}
		x.Down, err = view(d, H, I)
		return err
	})
}
