# shellcheck shell=bash
# The part scripts/demo and scripts/test share: install what is missing, configure the build.
# Sourced, never run. Settings, from the environment:
#   COHORT_BUILD_DIR  build directory, relative to the repository root or absolute (default: build)
#   COHORT_JOBS       parallel build jobs (default: 2)

COHORT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
COHORT_BUILD_DIR="${COHORT_BUILD_DIR:-build}"
if [[ "${COHORT_BUILD_DIR}" != /* ]]; then
  COHORT_BUILD_DIR="${COHORT_ROOT}/${COHORT_BUILD_DIR}"
fi
COHORT_JOBS="${COHORT_JOBS:-2}"

# Debian packages for building the library, its tests, benchmarks and examples
# (docs/dependencies.md says what each is for).
COHORT_PACKAGES=(cmake ninja-build g++ git libboost-dev libboost-serialization-dev zlib1g-dev libssl-dev
                 libxxhash-dev nlohmann-json3-dev doctest-dev libbenchmark-dev libcli11-dev
                 openmpi-bin libeigen3-dev libtorch-dev libopenblas0-pthread iproute2)

cohort_say() { printf '==> %s\n' "$*"; }

# Prints the packages of "$@" that are not installed, one per line.
cohort_missing_packages() {
  local package
  for package in "$@"; do
    if [[ "$(dpkg-query -W -f='${db:Status-Status}' "${package}" 2>/dev/null)" != installed ]]; then
      printf '%s\n' "${package}"
    fi
  done
}

# Installs the missing packages with apt; does nothing (no apt-get update either) if none is.
cohort_install_dependencies() {
  if ! command -v dpkg-query >/dev/null 2>&1; then
    cohort_say "no dpkg-query (not Debian?): not installing; needed: ${COHORT_PACKAGES[*]}"
    return 0
  fi
  local missing
  mapfile -t missing < <(cohort_missing_packages "${COHORT_PACKAGES[@]}")
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  local as_root=()
  if [[ "$(id -u)" -ne 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
      echo "error: missing ${missing[*]}, and installing needs root or sudo" >&2
      return 1
    fi
    as_root=(sudo)
  fi
  cohort_say "installing ${missing[*]}"
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
}

# Configures ${COHORT_BUILD_DIR}: Release, with Ninja unless the directory was already configured
# with another generator (CMake refuses to change it); "$@" are further cmake arguments.
cohort_configure() {
  local arguments=(-S "${COHORT_ROOT}" -B "${COHORT_BUILD_DIR}" -DCMAKE_BUILD_TYPE=Release "$@")
  if [[ ! -f "${COHORT_BUILD_DIR}/CMakeCache.txt" ]]; then
    arguments+=(-G Ninja)
  fi
  cohort_say "configuring ${COHORT_BUILD_DIR}"
  cmake "${arguments[@]}"
}
