// Captures this process's stderr in a test: CapturedStderr log; ...; log.finish().
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace cohort::testing {

// Sends this process's stderr to a file while it lives, to count what was logged.
class CapturedStderr {
 public:
  CapturedStderr()
      : file_(std::filesystem::temp_directory_path() /
              ("cohort-stderr-" + std::to_string(::getpid()))) {
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    const int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  CapturedStderr(const CapturedStderr&) = delete;
  CapturedStderr& operator=(const CapturedStderr&) = delete;
  ~CapturedStderr() {
    restore();
    std::filesystem::remove(file_);
  }
  // Restores stderr and returns what was written to it.
  std::string finish() {
    restore();
    std::ifstream in(file_);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  std::filesystem::path file_;
  int saved_ = -1;
};

}  // namespace cohort::testing
