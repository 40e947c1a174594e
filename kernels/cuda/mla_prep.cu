// The small kernels around the MLA block's GEMMs, so that a decode step
// keeps its activations on the device: RMSNorm, DeepSeek's rotary embedding
// (interleaved pairs in, halves out) and a row copy that gathers, scatters,
// slices and converts to bf16 (the head layouts of the grouped GEMMs, the
// absorbed queries, the latent rows written into the paged cache). The
// same source compiles with nvcc and, for the CPU emulation, with g++.
#ifndef MOEX_EMU
#include <cstdint>
#include <cstring>
#endif

namespace moex {

constexpr int kNormThreads = 128;
constexpr int kRopeThreads = 64;
constexpr int kMaxRope = 512;  // rope dims one block holds
constexpr int kCopyThreads = 128;

// moex_rmsnorm: x[r, col … col+width) *= w / sqrt(mean(x²) + eps) in place,
// for row r = blockIdx.x of stride values; the sum of squares in fp64 (as
// the CPU path), the scaled value rounded to fp32 before the weight.
extern "C" __global__ void moex_rmsnorm(float* x, int stride, int col, int width, const float* __restrict__ w, double eps) {
  __shared__ double part[kNormThreads];
  float* v = x + (size_t)blockIdx.x * stride + col;
  double s = 0;
  for (int j = threadIdx.x; j < width; j += kNormThreads) s += double(v[j]) * double(v[j]);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int n = kNormThreads / 2; n > 0; n /= 2) {
    if (threadIdx.x < n) part[threadIdx.x] += part[threadIdx.x + n];
    __syncthreads();
  }
  const double r = 1.0 / sqrt(part[0] / width + eps);
  for (int j = threadIdx.x; j < width; j += kNormThreads) v[j] = float(double(v[j]) * r) * w[j];
}

// moex_rope: rotates x[r, col … col+width) in place for position
// pos[r / perPos] (perPos rows share a token: the heads of its query): the
// pairs (x[2i], x[2i+1]) stored interleaved, as DeepSeek's checkpoints hold
// them, come out as halves [rotated evens; rotated odds]. freq holds the
// width/2 inverse frequencies then the cos/sin scale (yarn's mscale), fp64.
extern "C" __global__ void moex_rope(float* x, int stride, int col, int width, int perPos, const int32_t* __restrict__ pos,
                                     const double* __restrict__ freq) {
  __shared__ float in[kMaxRope];
  float* v = x + (size_t)blockIdx.x * stride + col;
  for (int j = threadIdx.x; j < width; j += kRopeThreads) in[j] = v[j];
  __syncthreads();
  const int half = width / 2;
  const double p = pos[blockIdx.x / perPos], scale = freq[half];
  for (int i = threadIdx.x; i < half; i += kRopeThreads) {
    const double a = p * freq[i], cs = cos(a) * scale, sn = sin(a) * scale;
    const double x0 = in[2 * i], x1 = in[2 * i + 1];
    v[i] = float(x0 * cs - x1 * sn);
    v[i + half] = float(x1 * cs + x0 * sn);
  }
}

__device__ __forceinline__ uint16_t bf16Bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return uint16_t((u >> 16) | 0x40);  // NaN stays quiet
  u += 0x7fff + ((u >> 16) & 1);                                          // to nearest even
  return uint16_t(u >> 16);
}

// moex_copy_rows: for row i = blockIdx.x, dst[di, dstCol … +width) =
// src[si, srcCol … +width) with si = srcMap[i] and di = dstMap[i] (null:
// i; a negative index skips the row), strides in values; dst is fp32, or
// bf16 (rounded to nearest even) when dstBF16.
extern "C" __global__ void moex_copy_rows(const float* __restrict__ src, int srcStride, int srcCol,
                                          const int32_t* __restrict__ srcMap, void* dst, int dstBF16, int dstStride,
                                          int dstCol, const int32_t* __restrict__ dstMap, int width) {
  const int i = blockIdx.x;
  const int si = srcMap != nullptr ? srcMap[i] : i, di = dstMap != nullptr ? dstMap[i] : i;
  if (si < 0 || di < 0) return;
  const float* s = src + (size_t)si * srcStride + srcCol;
  const size_t d0 = (size_t)di * dstStride + dstCol;
  if (dstBF16) {
    uint16_t* d = static_cast<uint16_t*>(dst) + d0;
    for (int j = threadIdx.x; j < width; j += kCopyThreads) d[j] = bf16Bits(s[j]);
  } else {
    float* d = static_cast<float*>(dst) + d0;
    for (int j = threadIdx.x; j < width; j += kCopyThreads) d[j] = s[j];
  }
}

}  // namespace moex
