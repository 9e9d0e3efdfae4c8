// How cohort's definitions are compiled: in every translation unit that uses them (header-only,
// the default), or once, in one source file of the program (separate compilation, the Boost.Asio
// habit). docs/dependencies.md, "Separate compilation", says when to choose which.
//
// A program that trains across processes instantiates the TCP transport, the rendezvous, cluster
// resolution, checkpoint files and the parameter server's protocol: code that does not depend on
// its model, which header-only compiles again in every file that names a multi-process strategy,
// most of that file's build time (docs/benchmarks.md, "Compile time of a one-file program"). With
// separate compilation it is compiled once:
//
//   1. define COHORT_SEPARATE_COMPILATION for every translation unit of the program (mixing the
//      two forms in one program breaks the one-definition rule);
//   2. compile one source file that is the whole of `#include <cohort/src.hpp>`, and link it.
//
// cohort::tcp does both for a CMake target. The definitions are the same either way: only where
// they are compiled changes.
#pragma once

// Opens the declaration of a function defined in an impl/*.ipp file: inline where its header
// includes the .ipp (header-only), an ordinary external function where src.hpp compiles it once.
#if defined(COHORT_SEPARATE_COMPILATION)
#define COHORT_DECL
#else
#define COHORT_DECL inline
#endif

// Opens a line naming a template specialization that src.hpp compiles once, for the types
// cohort's own strategies use (float and double values, the TCP transport): in a program's files
// an explicit instantiation declaration, so that they compile none of it, and in src.hpp (which
// defines COHORT_COMPILING_SOURCE first) its definition. Such lines stand in
// `#if defined(COHORT_SEPARATE_COMPILATION)` at the end of the header that chooses those types;
// other types are instantiated where they are used, as header-only.
#if defined(COHORT_SEPARATE_COMPILATION) && defined(COHORT_COMPILING_SOURCE)
#define COHORT_INSTANTIATED template
#elif defined(COHORT_SEPARATE_COMPILATION)
#define COHORT_INSTANTIATED extern template
#endif
