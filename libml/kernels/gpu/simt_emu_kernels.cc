// The GPU kernel library for the SIMT emulation target (simt_emu.h, -Dgpu_emu=true): the same
// .cu sources, compiled here by the host compiler with REEFLINE_SIMT_EMU=1.
#include "libml/kernels/gpu/registry.cu"
#include "libml/kernels/gpu/gemm_conv.cu"
#include "libml/kernels/gpu/elementwise.cu"
#include "libml/kernels/gpu/gather.cu"
#include "libml/kernels/gpu/spin.cu"
