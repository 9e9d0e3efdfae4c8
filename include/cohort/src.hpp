// The definitions that separate compilation compiles once (core/compilation.hpp says how). The
// whole of one source file of a program whose every translation unit defines
// COHORT_SEPARATE_COMPILATION:
//
//   // cohort_compiled.cpp
//   #include <cohort/src.hpp>
//
// It needs what cohort::tcp needs (docs/dependencies.md); cohort::tcp is this file, compiled.
#pragma once

#if !defined(COHORT_SEPARATE_COMPILATION)
#error "cohort/src.hpp: define COHORT_SEPARATE_COMPILATION for every file of the program"
#endif
#if defined(COHORT_DECL)
#error "cohort/src.hpp is the whole of its file: a cohort header was included before it"
#endif

#define COHORT_COMPILING_SOURCE

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/checkpoint/in_place_write.hpp"
#include "cohort/cluster/impl/binding.ipp"
#include "cohort/cluster/impl/cluster.ipp"
#include "cohort/cluster/impl/environment.ipp"
#include "cohort/cluster/impl/slurm.ipp"
#include "cohort/cluster/impl/tf_config.ipp"
#include "cohort/core/impl/settings.ipp"
#include "cohort/core/impl/trace.ipp"
#include "cohort/strategy/multi_worker_mirrored.hpp"
#include "cohort/strategy/parameter_server.hpp"
#include "cohort/transport/tcp/impl/door.ipp"
#include "cohort/transport/tcp/impl/listener.ipp"
#include "cohort/transport/tcp/impl/regroup.ipp"
#include "cohort/transport/tcp/impl/roll_call.ipp"
#include "cohort/transport/tcp/impl/tcp.ipp"
