// The one CUDA translation unit of cohort-bench (CUDA builds only): every kernel of
// cuda/launch.hpp, instantiated, for the nccl backend's NcclCommunicator (deterministic mode).
#include "cohort/cuda/instantiate.cuh"
