package kernels

import (
	"fmt"
	"testing"
)

// BenchmarkKernelL1 times one micro-kernel on data that stays in L1: the
// kernel's own throughput, without memory effects.
func BenchmarkKernelL1(b *testing.B) {
	for _, s := range simds {
		for _, mr := range []int{1, s.maxMR} {
			b.Run(fmt.Sprintf("%s/F32/mr=%d", s.name, mr), func(b *testing.B) {
				const K = 512
				var a [maxKernelRows]*float32
				rows := make([]float32, maxKernelRows*K)
				for i := range a {
					a[i] = &rows[i*K]
				}
				w := make([]float32, 4*K)
				m, _ := NewF32(4, K, w)
				var bp [4]*byte
				for n := range bp {
					bp[n] = m.rowPtr(n)
				}
				var out [4 * maxKernelRows]float32
				var lane laneAcc
				for b.Loop() {
					s.kern[F32][mr](&a, &bp, K, &lane, 2, &out)
				}
				b.ReportMetric(float64(2*mr*4*K)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkOuterL1 times the widest one-row outer-product kernel of each
// weight format on panels that stay in L1: the weight bytes a core can
// widen and multiply per second, the ceiling of a decode step where memory
// is not the limit.
func BenchmarkOuterL1(b *testing.B) {
	const K = 256 // four panels of 256 k steps: at most 64 KiB of weights
	for _, s := range simds {
		var a [maxKernelRows]*float32
		rows := make([]float32, K)
		a[0] = &rows[0]
		c := make([]float32, 4*PanelWidth)
		scales := make([]float32, 4*PanelWidth)
		table := e2m1
		for _, dt := range []DType{F32, BF16, F8E4M3, MXFP4} {
			bits := dt.Bits()
			w := make([]byte, 4*PanelWidth*K*bits/8)
			stride := PanelWidth * K * bits / 8
			var run func()
			switch dt {
			case F8E4M3:
				ks := s.outerFP8[1]
				run = func() { ks[len(ks)-1](&a, &w[0], stride, K, &c[0], 4*len(c), 0, &scales[0], 128, 0) }
			case MXFP4:
				ks := s.outerQ4[1]
				if len(ks) < 2 {
					continue
				}
				run = func() { ks[len(ks)-1](&a, &w[0], stride, K, &c[0], 4*len(c), 0, &scales[0], &table[0], 32, 0) }
			default:
				ks := s.outer[dt][1]
				run = func() { ks[len(ks)-1](&a, &w[0], stride, K, &c[0], 4*len(c), 0) }
			}
			b.Run(fmt.Sprintf("%s/%v", s.name, dt), func(b *testing.B) {
				b.SetBytes(int64(len(w)))
				for b.Loop() {
					run()
				}
			})
			if ks := s.outerQ4P[1]; dt == MXFP4 && len(ks) > 1 {
				for i := range scales {
					scales[i] = 1
				}
				b.Run(fmt.Sprintf("%s/%v-pow2", s.name, dt), func(b *testing.B) {
					b.SetBytes(int64(len(w)))
					for b.Loop() {
						ks[len(ks)-1](&a, &w[0], stride, K, &c[0], 4*len(c), 0, &scales[0], &table[0], 32, 0)
					}
				})
			}
		}
	}
}

// BenchmarkOuterStream times the widest one-row kernel of each weight
// format streaming 64 MiB of panels from memory on one core (K = 2048, a
// decode step's shape), beside ReadBytes over the same buffer: how much of
// a core's read bandwidth the kernel keeps.
func BenchmarkOuterStream(b *testing.B) {
	const K, size = 2048, 64 << 20
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i*7 + i>>9)
	}
	b.Run("read", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			ReadBytes(buf)
		}
	})
	for _, s := range simds {
		var a [maxKernelRows]*float32
		rows := make([]float32, K)
		for i := range rows {
			rows[i] = 1
		}
		a[0] = &rows[0]
		for _, dt := range []DType{BF16, F8E4M3, MXFP4} {
			stride := PanelWidth * K * dt.Bits() / 8
			P := size / stride
			c := make([]float32, P*PanelWidth)
			scales := make([]float32, P*PanelWidth*K/32)
			table := e2m1
			var call func(np, p int)
			var widest int
			switch dt {
			case F8E4M3:
				ks := s.outerFP8[1]
				widest = len(ks) - 1
				call = func(np, p int) {
					ks[np](&a, &buf[p*stride], stride, K, &c[p*PanelWidth], 4*len(c), 0, &scales[p*PanelWidth], 128, 4*P*PanelWidth)
				}
			case MXFP4:
				ks := s.outerQ4[1]
				if len(ks) < 2 {
					continue
				}
				widest = len(ks) - 1
				call = func(np, p int) {
					ks[np](&a, &buf[p*stride], stride, K, &c[p*PanelWidth], 4*len(c), 0, &scales[p*PanelWidth], &table[0], 32, 4*P*PanelWidth)
				}
			default:
				ks := s.outer[dt][1]
				widest = len(ks) - 1
				call = func(np, p int) {
					ks[np](&a, &buf[p*stride], stride, K, &c[p*PanelWidth], 4*len(c), 0)
				}
			}
			b.Run(fmt.Sprintf("%s/%v", s.name, dt), func(b *testing.B) {
				b.SetBytes(int64(P * stride))
				for b.Loop() {
					for p := 0; p < P; p += widest {
						call(min(widest, P-p), p)
					}
				}
			})
		}
	}
}

// BenchmarkDot8 times the int8-dot kernels of 1 to 4 rows on Q4_K-shaped
// UINT4 panels (groups of 32, offsets, K-quant factors), each panel count
// a call: on four panels that stay in L1 (the kernels' own rate), and streaming 64 MiB of
// panels from memory on one core beside ReadBytes over the same bytes.
func BenchmarkDot8(b *testing.B) {
	for _, s := range simds {
		if s.dot8 == nil {
			continue
		}
		for _, c := range []struct {
			name string
			K, P int
		}{{"L1", 256, 4}, {"stream", 2048, (64 << 20) / (PanelWidth * 2048 / 2)}} {
			K, P := c.K, c.P
			panel := PanelWidth * K / 2
			w := make([]byte, P*panel)
			for i := range w {
				w[i] = byte(i*7 + i>>9)
			}
			groups := K / 32
			supers := K / 256
			run := supers * (512 + 8*128)
			meta := make([]byte, (P+dot8Run-1)/dot8Run*run)
			var a [maxDot8Rows]*byte
			for m := range a {
				a[m] = &make([]byte, groups*48)[0]
			}
			out := make([]float32, maxDot8Rows*P*PanelWidth)
			b.Run(fmt.Sprintf("%s/%s", s.name, c.name), func(b *testing.B) {
				if c.name == "stream" {
					b.Run("read", func(b *testing.B) {
						b.SetBytes(int64(len(w)))
						for b.Loop() {
							ReadBytes(w)
						}
					})
				}
				for rows := 1; rows <= maxDot8Rows; rows++ {
					ks := s.dot8.u4km[rows]
					for np := 1; np < len(ks); np *= 2 { // calls inside one run of panels
						b.Run(fmt.Sprintf("u4km/rows=%d/np=%d", rows, np), func(b *testing.B) {
							b.SetBytes(int64(len(w)))
							for b.Loop() {
								for p := 0; p < P; p += np {
									ks[np](&a, &w[p*panel], panel, groups, &out[p*PanelWidth], 4*P*PanelWidth, 0, &meta[p/dot8Run*run], 16*(p%dot8Run), 4, 8)
								}
							}
						})
					}
				}
			})
		}
	}
}
