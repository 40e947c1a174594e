//go:build !purego

package kernels

import "github.com/klauspost/cpuid/v2"

// The AVX2 kernels need FMA and F16C as well; the AVX-512 ones need BW for
// the bf16 widening (VPMOVZXWD on zmm) and DQ for VXORPS on zmm.
var (
	hasAVX2   = cpuid.CPU.Supports(cpuid.AVX2, cpuid.FMA3, cpuid.F16C)
	hasAVX512 = hasAVX2 && cpuid.CPU.Supports(cpuid.AVX512F, cpuid.AVX512BW, cpuid.AVX512DQ)
	// hasVNNI: the int8-dot kernels' vpdpbusd on zmm.
	hasVNNI = hasAVX512 && cpuid.CPU.Supports(cpuid.AVX512VNNI)
	// hasVBMI: vpermb, for the MXFP4 int8-dot kernels (dot8AVX512M4V).
	hasVBMI = hasAVX512 && cpuid.CPU.Supports(cpuid.AVX512VBMI)
	// hasBF16: the bf16-dot kernels' vdpbf16ps.
	hasBF16 = hasAVX512 && cpuid.CPU.Supports(cpuid.AVX512BF16)
)

func init() {
	if hasAVX2 {
		s := &simd{name: "avx2", lanes: 8, maxMR: 3}
		s.kern[F32] = [maxKernelRows + 1]kernelFunc{nil, dotAVX2F32x1, dotAVX2F32x2, dotAVX2F32x3}
		s.kern[BF16] = [maxKernelRows + 1]kernelFunc{nil, dotAVX2BF16x1, dotAVX2BF16x2, dotAVX2BF16x3}
		s.kern[F16] = [maxKernelRows + 1]kernelFunc{nil, dotAVX2F16x1, dotAVX2F16x2, dotAVX2F16x3}
		s.maxMR8 = 1
		s.kern8[F32][1], s.kern8[BF16][1], s.kern8[F16][1] = dotAVX2F32x1n8, dotAVX2BF16x1n8, dotAVX2F16x1n8
		s.outer, s.outerFP8, s.outerQ4 = outerAVX2, outerFP8AVX2, outerQ4AVX2
		s.outerQ8, s.outerQ8M, s.outerQ4M = outerQ8AVX2, outerQ8MAVX2, outerQ4MAVX2
		s.outerS5, s.outerU5M, s.outerS6 = outerS5AVX2, outerU5MAVX2, outerS6AVX2
		s.kscale, s.kscaleM, s.half, s.e8, s.bf16, s.prefetch = kscalesAVX2, kscalesAVX2M, halfRunsAVX2, e8RunsAVX2, bf16RunsAVX2, prefetchRuns
		s.dot8 = &dot8AVX2
		s.quant8[8], s.quant8[16], s.quant8[32] = quant8AVX2G8, quant8AVX2G16, quant8AVX2G32
		s.routerDot = routerDotAVX2
		s.gate, s.gateGELU = gateAVX2, gateAVX2GELU
		s.expShifted, s.expLanes = expShiftedAVX2, 4
		register(s)
	}
	if hasAVX512 {
		s := &simd{name: "avx512", lanes: 16, maxMR: 6}
		s.kern[F32] = [maxKernelRows + 1]kernelFunc{nil, dotAVX512F32x1, dotAVX512F32x2, dotAVX512F32x3, dotAVX512F32x4, dotAVX512F32x5, dotAVX512F32x6}
		s.kern[BF16] = [maxKernelRows + 1]kernelFunc{nil, dotAVX512BF16x1, dotAVX512BF16x2, dotAVX512BF16x3, dotAVX512BF16x4, dotAVX512BF16x5, dotAVX512BF16x6}
		s.kern[F16] = [maxKernelRows + 1]kernelFunc{nil, dotAVX512F16x1, dotAVX512F16x2, dotAVX512F16x3, dotAVX512F16x4, dotAVX512F16x5, dotAVX512F16x6}
		s.maxMR8 = 3
		s.kern8[F32] = [maxKernelRows + 1]kernel8Func{nil, dotAVX512F32x1n8, dotAVX512F32x2n8, dotAVX512F32x3n8}
		s.kern8[BF16] = [maxKernelRows + 1]kernel8Func{nil, dotAVX512BF16x1n8, dotAVX512BF16x2n8, dotAVX512BF16x3n8}
		s.kern8[F16] = [maxKernelRows + 1]kernel8Func{nil, dotAVX512F16x1n8, dotAVX512F16x2n8, dotAVX512F16x3n8}
		s.outer, s.outerFP8, s.outerQ4, s.outerQ4P = outerAVX512, outerFP8AVX512, outerQ4AVX512, outerQ4PAVX512
		s.outerQ8, s.outerQ8M, s.outerQ4M = outerQ8AVX512, outerQ8MAVX512, outerQ4MAVX512
		s.dqFP8, s.dqQ4 = dqAVX512F8, dqAVX512Q4
		s.dqQ8, s.dqQ8M, s.dqQ4M = dqAVX512Q8, dqAVX512Q8M, dqAVX512Q4M
		s.outerS5, s.outerU5M, s.outerS6 = outerS5AVX512, outerU5MAVX512, outerS6AVX512
		s.kscale, s.kscaleM, s.half, s.e8, s.bf16, s.prefetch = kscalesAVX512, kscalesAVX512M, halfRunsAVX512, e8RunsAVX512, bf16RunsAVX512, prefetchRuns
		s.dqS5, s.dqU5M, s.dqS6 = dqAVX512S5, dqAVX512U5M, dqAVX512S6
		s.dot8 = &dot8AVX2 // AVX-512 without VNNI: the AVX2 kernels
		if hasVNNI {
			s.dot8 = &dot8AVX512
			if hasVBMI { // MXFP4's nibbles looked up by vpermb
				k := dot8AVX512
				k.m4 = dot8AVX512M4V
				s.dot8 = &k
			}
		}
		s.quant8[8], s.quant8[16], s.quant8[32] = quant8AVX512G8, quant8AVX512G16, quant8AVX512G32
		if hasBF16 {
			s.bdot = &bdotAVX512
			bdotPeak = bdotPeakAVX512
		}
		readSIMD = readAVX512
		s.routerDot = routerDotAVX512
		s.gate, s.gateGELU = gateAVX512, gateAVX512GELU
		s.expShifted, s.expLanes = expShiftedAVX512, 8
		s.maxMin = maxMinAVX512
		s.attnScores[F32] = [...]attnScoresFunc{attnScoresAVX512F32D64, attnScoresAVX512F32D128, attnScoresAVX512F32D256, attnScoresAVX512F32D512, attnScoresAVX512F32D576}
		s.attnScores[BF16] = [...]attnScoresFunc{attnScoresAVX512BF16D64, attnScoresAVX512BF16D128, attnScoresAVX512BF16D256, attnScoresAVX512BF16D512, attnScoresAVX512BF16D576}
		s.attnScores[F16] = [...]attnScoresFunc{attnScoresAVX512F16D64, attnScoresAVX512F16D128, attnScoresAVX512F16D256, attnScoresAVX512F16D512, attnScoresAVX512F16D576}
		s.attnWeigh[F32] = [...][2]attnWeighFunc{
			{attnWeighAVX512F32D64R4, attnWeighAVX512F32D64R8},
			{attnWeighAVX512F32D128R4, attnWeighAVX512F32D128R8},
			{attnWeighAVX512F32D256R4, attnWeighAVX512F32D256R8},
			{attnWeighAVX512F32D512R4, attnWeighAVX512F32D512R8},
			{attnWeighAVX512F32D576R4, attnWeighAVX512F32D576R8}}
		s.attnWeigh[BF16] = [...][2]attnWeighFunc{
			{attnWeighAVX512BF16D64R4, attnWeighAVX512BF16D64R8},
			{attnWeighAVX512BF16D128R4, attnWeighAVX512BF16D128R8},
			{attnWeighAVX512BF16D256R4, attnWeighAVX512BF16D256R8},
			{attnWeighAVX512BF16D512R4, attnWeighAVX512BF16D512R8},
			{attnWeighAVX512BF16D576R4, attnWeighAVX512BF16D576R8}}
		s.attnWeigh[F16] = [...][2]attnWeighFunc{
			{attnWeighAVX512F16D64R4, attnWeighAVX512F16D64R8},
			{attnWeighAVX512F16D128R4, attnWeighAVX512F16D128R8},
			{attnWeighAVX512F16D256R4, attnWeighAVX512F16D256R8},
			{attnWeighAVX512F16D512R4, attnWeighAVX512F16D512R8},
			{attnWeighAVX512F16D576R4, attnWeighAVX512F16D576R8}}
		register(s)
	}
}
