// Package cuda is the GPU runtime of moex over gorgonia.org/cu (build tag
// cuda): a device context, the embedded kernel fatbin, device buffers and
// one typed launcher per kernel of kernels/cuda. gorgonia.org/cu calls
// cuInit in its package init and exits the process when no GPU is usable,
// so nothing outside the cuda tag imports it; builds without the tag get
// this documentation only.
package cuda
