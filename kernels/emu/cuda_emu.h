// CPU emulation of the CUDA subset moex's kernels use, so that the same .cu
// sources compile with g++ (-std=c++20) and run on CPU threads:
//
//   - every CUDA thread of a block is a real std::thread; blocks run one
//     after another, so `__shared__` (static storage here) is the block's;
//   - __syncthreads() is a barrier over the block's threads;
//   - warp shuffles and votes synchronise the 32 threads of a warp through a
//     per-warp exchange buffer and barrier (a block's size must be a
//     multiple of 32 when they are used).
//
// It is for correctness checks on machines without a GPU, not for speed.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define MOEX_EMU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3() = default;
  dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {

struct Block {
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<uint64_t> exchange;  // one slot per thread, for warp shuffles
};

inline thread_local dim3 tThreadIdx;
inline thread_local dim3 tBlockIdx;
inline thread_local Block* tBlock = nullptr;
inline dim3 gBlockDim, gGridDim;

inline unsigned linearThread() {
  return tThreadIdx.x + gBlockDim.x * (tThreadIdx.y + gBlockDim.y * tThreadIdx.z);
}

// launch runs kernel(args...) over grid × block, one block at a time.
template <typename... Params, typename... Args>
void launch(dim3 grid, dim3 block, void (*kernel)(Params...), Args... args) {
  gGridDim = grid;
  gBlockDim = block;
  const unsigned n = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        Block b;
        b.all = std::make_unique<std::barrier<>>(n);
        for (unsigned w = 0; w < (n + 31) / 32; w++)
          b.warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, n - 32 * w)));
        b.exchange.assign(n, 0);
        std::vector<std::thread> threads;
        threads.reserve(n);
        for (unsigned t = 0; t < n; t++) {
          threads.emplace_back([&, t] {
            tBlock = &b;
            tBlockIdx = dim3(bx, by, bz);
            tThreadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
            kernel(args...);
          });
        }
        for (auto& th : threads) th.join();
      }
}

}  // namespace emu

#define threadIdx (emu::tThreadIdx)
#define blockIdx (emu::tBlockIdx)
#define blockDim (emu::gBlockDim)
#define gridDim (emu::gGridDim)

inline void __syncthreads() { emu::tBlock->all->arrive_and_wait(); }

// Warp shuffles: every lane publishes its value, the warp meets, each lane
// reads its source, the warp meets again before the slots are reused.
template <typename T>
inline T emuShuffle(T v, unsigned srcLane) {
  static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
  unsigned me = emu::linearThread(), warp = me / 32;
  uint64_t slot = 0;
  std::memcpy(&slot, &v, sizeof(T));
  emu::tBlock->exchange[me] = slot;
  emu::tBlock->warps[warp]->arrive_and_wait();
  uint64_t got = emu::tBlock->exchange[warp * 32 + (srcLane & 31)];
  emu::tBlock->warps[warp]->arrive_and_wait();
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int laneMask, int = 32) {
  return emuShuffle(v, (emu::linearThread() % 32) ^ unsigned(laneMask));
}
template <typename T>
inline T __shfl_sync(unsigned, T v, int srcLane, int = 32) {
  return emuShuffle(v, unsigned(srcLane));
}
inline unsigned __ballot_sync(unsigned, int pred) {
  unsigned me = emu::linearThread(), warp = me / 32;
  emu::tBlock->exchange[me] = pred ? 1 : 0;
  emu::tBlock->warps[warp]->arrive_and_wait();
  unsigned bits = 0;
  unsigned lanes = std::min(32u, unsigned(emu::tBlock->exchange.size()) - warp * 32);
  for (unsigned l = 0; l < lanes; l++)
    if (emu::tBlock->exchange[warp * 32 + l]) bits |= 1u << l;
  emu::tBlock->warps[warp]->arrive_and_wait();
  return bits;
}

// Atomics on block-shared or global memory.
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float atomicAdd(float* p, float v) {
  float old = *p, want;
  do {
    want = old + v;
  } while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
  return old;
}

using std::max;
using std::min;

inline float __expf(float x) { return std::exp(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
