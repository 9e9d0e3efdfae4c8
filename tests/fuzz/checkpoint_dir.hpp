// A private directory for a checkpoint fuzz target's files, removed at exit: in /dev/shm where
// there is one, since every write fsyncs.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace cohort::fuzz {

inline const std::filesystem::path& scratch_directory() {
  static const struct Scratch {
    std::filesystem::path path;
    Scratch() {
      namespace fs = std::filesystem;
      const fs::path base =
          fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
      std::string name = (base / "cohort-fuzz-XXXXXX").string();
      if (::mkdtemp(name.data()) == nullptr) std::abort();
      path = name;
    }
    ~Scratch() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } scratch;
  return scratch.path;
}

}  // namespace cohort::fuzz
