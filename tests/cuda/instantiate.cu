// The one CUDA translation unit of test_cuda: every kernel of cuda/launch.hpp, instantiated.
#include "cohort/cuda/instantiate.cuh"
