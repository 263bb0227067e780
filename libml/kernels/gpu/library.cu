// The GPU kernel library as one translation unit: the DKP kernel (dkp.cu) calls every
// kernel's block functions, which are internal to their files, and the registration
// (registry.cu) names every kernel's entry points. nvcc and hipcc compile this file; the SIMT
// emulation compiles it with the host compiler (simt_emu_kernels.cc).
#include "libml/kernels/gpu/gemm_conv.cu"
#include "libml/kernels/gpu/elementwise.cu"
#include "libml/kernels/gpu/gather.cu"
#include "libml/kernels/gpu/spin.cu"
#include "libml/kernels/gpu/dkp.cu"
#include "libml/kernels/gpu/level_relay.cu"
#include "libml/kernels/gpu/registry.cu"
