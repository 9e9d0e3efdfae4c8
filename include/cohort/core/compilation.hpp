// How cohort's compiled parts are compiled: in every translation unit that includes them
// (header-only, the default), or once, in one source file of the program (separate compilation,
// the Boost.Asio habit).
//
// A program that trains across processes instantiates the TCP transport, the rendezvous and the
// cluster resolution, code that does not depend on its model, and compiles all of it again in
// every file that names a multi-process strategy: most of that file's build time
// (docs/benchmarks.md, "Compile time of a one-file program"). With separate compilation those
// definitions are compiled once:
//
//   1. define COHORT_SEPARATE_COMPILATION for every translation unit of the program (mixing the
//      two forms in one program breaks the one-definition rule);
//   2. compile one source file that is the whole of `#include <cohort/src.hpp>`, and link it.
//
// Nothing changes in what the code does: the same definitions, compiled in another place.
#pragma once

// The source file's own switch, set by src.hpp before anything else.
#if defined(COHORT_SEPARATE_COMPILATION) && defined(COHORT_COMPILING_SOURCE)
#define COHORT_INSTANTIATED template
#elif defined(COHORT_SEPARATE_COMPILATION)
#define COHORT_INSTANTIATED extern template
#endif

// Prefixes a function whose definition lives in an impl/*.ipp file: inline when the .ipp is
// included by its header, an ordinary external definition when src.hpp compiles it once.
#if defined(COHORT_SEPARATE_COMPILATION)
#define COHORT_DECL
#else
#define COHORT_DECL inline
#endif

// COHORT_INSTANTIATED opens a line naming a template specialization that src.hpp compiles once,
// for the types cohort's own strategies use (float and double values, the TCP transport): in a
// program's files an explicit instantiation declaration, so that they compile none of it, and in
// src.hpp its definition. The lines stand in `#if defined(COHORT_SEPARATE_COMPILATION)` at the
// end of the header whose template they name; other types are instantiated where used, as
// header-only.

