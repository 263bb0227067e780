// The GPU kernel library for the SIMT emulation target (preempt/simt_emu.h, -Dgpu_emu=true):
// the same sources, compiled here by the host compiler with REEFLINE_SIMT_EMU=1.
#include "libml/kernels/gpu/library.cu"
