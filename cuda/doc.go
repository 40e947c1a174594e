// Package cuda will own the GPU runtime (build tag cuda): context, streams,
// device buffers, the embedded kernel module, typed kernel launchers and
// CUDA graph capture, over gorgonia.org/cu.
package cuda
