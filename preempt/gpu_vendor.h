// One kernel source for CUDA and HIP: the CUDA runtime names the GPU code is written with,
// mapped to HIP's when the code is compiled for AMD GPUs.
//
// - Kernel sources (*.cu) are compiled by nvcc, or by hipcc (`-x hip`), which defines
//   __HIPCC__.
// - Host-only sources that use the runtime API (preempt/gpu_device.cc) are compiled by the
//   ordinary C++ compiler; the build defines REEFLINE_HIP=1 (and __HIP_PLATFORM_AMD__) in a
//   HIP build, so they take the same branch.
//
// Only names the project uses are mapped: a new use of a CUDA name shows up as a compile
// error in the HIP build (scripts/test builds it), which is where its mapping is added.
#pragma once

#if defined(REEFLINE_SIMT_EMU) && REEFLINE_SIMT_EMU
// The kernel sources on the host compiler, run by a software SIMT machine (simt_emu.h): for
// testing the kernels and the device backend on machines without a GPU.
#include "preempt/simt_emu.h"
#define RL_GPU_RUNTIME_NAME "SIMT emulation"
#define RL_HOST_COHERENT 0u
#define RL_LAUNCH(kernel, grid, block, shared, stream, ...) \
    ::rl_emu::enqueue((stream), (grid), (block), (shared), [=] { kernel(__VA_ARGS__); })
#define RL_DYNAMIC_SHARED(name) unsigned char* name = ::rl_emu::dynamic_shared()
#define RL_GPU_WMMA 1  // emulated (simt_emu.h), so the tensor-core path's tiling runs too
// Spatial shares: a stream whose launches run only on the emulated units of a mask (the
// emulation's extension, shaped like HIP's below).
#define RL_GPU_CU_MASK_STREAM rlEmuStreamCreateWithCUMask

#elif defined(__HIPCC__) || (defined(REEFLINE_HIP) && REEFLINE_HIP)
#define RL_GPU_HIP 1
#if !defined(__HIP_PLATFORM_AMD__) && !defined(__HIP_PLATFORM_NVIDIA__)
#define __HIP_PLATFORM_AMD__ 1
#endif
#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#else
#include <hip/hip_runtime_api.h>
#endif

#define RL_GPU_RUNTIME_NAME "HIP"

// Types
#define cudaError_t hipError_t
#define cudaStream_t hipStream_t
#define cudaEvent_t hipEvent_t
#define cudaDeviceProp hipDeviceProp_t

// Status codes
#define cudaSuccess hipSuccess
#define cudaErrorNotReady hipErrorNotReady
#define cudaErrorHostMemoryAlreadyRegistered hipErrorHostMemoryAlreadyRegistered
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaErrorInvalidValue hipErrorInvalidValue

// Device management and errors
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaSetDevice hipSetDevice
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrCanUseHostPointerForRegisteredMem hipDeviceAttributeCanUseHostPointerForRegisteredMem
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDeviceGetStreamPriorityRange hipDeviceGetStreamPriorityRange
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaGetLastError hipGetLastError
#define cudaPeekAtLastError hipPeekAtLastError
#define cudaGetErrorString hipGetErrorString
#define cudaRuntimeGetVersion hipRuntimeGetVersion
#define cudaDriverGetVersion hipDriverGetVersion

// Memory
#define cudaMalloc hipMalloc
#define cudaMemGetInfo hipMemGetInfo
#define cudaFree hipFree
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpyDefault hipMemcpyDefault
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaHostAlloc hipHostMalloc
#define cudaFreeHost hipHostFree
#define cudaHostAllocDefault hipHostMallocDefault
#define cudaHostAllocPortable hipHostMallocPortable
#define cudaHostAllocMapped hipHostMallocMapped
#define cudaHostGetDevicePointer hipHostGetDevicePointer
#define cudaHostRegister hipHostRegister
#define cudaHostUnregister hipHostUnregister
#define cudaHostRegisterPortable hipHostRegisterPortable
#define cudaHostRegisterMapped hipHostRegisterMapped
// Host memory the GPU and the host both read and write while kernels run (task words, inputs,
// gather lists): fine-grained and coherent on AMD whatever HIP_HOST_COHERENT says.
#define RL_HOST_COHERENT hipHostMallocCoherent
#define RL_LAUNCH(kernel, grid, block, shared, stream, ...) kernel<<<(grid), (block), (shared), (stream)>>>(__VA_ARGS__)

// Streams and events
#define cudaStreamCreateWithPriority hipStreamCreateWithPriority
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamQuery hipStreamQuery
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventDefault hipEventDefault
#define cudaEventCreate hipEventCreate
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaEventQuery hipEventQuery
#define cudaEventSynchronize hipEventSynchronize
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaStreamAddCallback hipStreamAddCallback
// Spatial shares: a stream whose launches run only on the CUs of a mask (AMD's extension; the
// stream gets the default priority, since HIP has no call taking both).
#define RL_GPU_CU_MASK_STREAM hipExtStreamCreateWithCUMask

// Kernel attributes and occupancy
#define cudaFuncAttributes hipFuncAttributes
#define cudaFuncGetAttributes hipFuncGetAttributes
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor

#else  // CUDA
#define RL_GPU_CUDA 1
#if defined(__CUDACC__)
#include <cuda_runtime.h>
#else
#include <cuda_runtime_api.h>
#endif
#define RL_GPU_RUNTIME_NAME "CUDA"
#define RL_HOST_COHERENT 0u  // cudaHostAlloc memory is coherent with the GPU
// Spatial shares: green contexts (driver API, CUDA 12.4+; streams in them 12.5+), which
// partition the SMs by count. Host code reaches them through the runtime's driver entry points
// (cudaGetDriverEntryPointByVersion), so nothing links libcuda and an older driver only lacks
// them at run time.
#define RL_GPU_GREEN_CONTEXTS 1
#if !defined(__CUDACC__)
#include <cudaTypedefs.h>  // cuda.h's types and the driver functions' pointer types
#endif
#define RL_LAUNCH(kernel, grid, block, shared, stream, ...) kernel<<<(grid), (block), (shared), (stream)>>>(__VA_ARGS__)
#endif

// Tensor cores through WMMA (nvcuda::wmma, sm_70+). hipcc 5.2 has no WMMA (rocWMMA is a
// separate library that Debian does not package), so the HIP build compiles the fp32 path
// only and a tensor-core request runs the fp32 kernels there.
#if defined(RL_GPU_CUDA) && defined(__CUDACC__)
#define RL_GPU_WMMA 1
#endif

// A kernel's dynamic shared memory (the launch's `shared` bytes), as a byte pointer `name`.
#if !defined(RL_GPU_EMU)
#define RL_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#endif
