// COHORT_HOST_DEVICE marks the elementwise rules that the CPU loops and the CUDA kernels share, so
// that both compute the same values from one definition.
#pragma once

#if defined(__CUDACC__)
#define COHORT_HOST_DEVICE __host__ __device__
#else
#define COHORT_HOST_DEVICE
#endif
