// Real processes for tests: spawn with extra environment variables and output captured in files,
// wait with a deadline, and never leave one running (the destructor kills what is left).
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace cohort::testing {

struct Exit {
  bool exited = false;  // false: killed by a signal
  int code = 0;         // exit status, or the signal
};

class Process {
 public:
  Process(const std::vector<std::string>& arguments, const std::map<std::string, std::string>& env,
          const std::filesystem::path& output) {
    std::vector<std::string> environment;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const std::string variable = *entry;
      if (!env.contains(variable.substr(0, variable.find('=')))) environment.push_back(variable);
    }
    for (const auto& [name, value] : env) environment.push_back(name + "=" + value);
    std::vector<char*> argv, envp;
    std::vector<std::string> args = arguments;
    for (auto& argument : args) argv.push_back(argument.data());
    argv.push_back(nullptr);
    for (auto& variable : environment) envp.push_back(variable.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int failed = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (failed != 0)
      throw std::runtime_error("cannot start " + arguments[0] + ": " + std::strerror(failed));
  }

  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  ~Process() {
    if (!exit_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  void kill(int signal) { ::kill(pid_, signal); }

  // The exit, or nothing if the process is still running at the deadline.
  std::optional<Exit> wait(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!exit_) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_ = WIFEXITED(status) ? Exit{true, WEXITSTATUS(status)} : Exit{false, WTERMSIG(status)};
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return exit_;
  }

 private:
  pid_t pid_ = 0;
  std::optional<Exit> exit_;
};

// A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's range of ephemeral ports
// where it can: a job binds it only later, and meanwhile any outgoing connection of this host
// could be given a port of that range, but never one below it.
inline int free_port() {
  int lowest_ephemeral = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lowest_ephemeral;
  const auto binds = [](int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    socklen_t length = sizeof address;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    ::close(fd);
    return bound ? static_cast<int>(ntohs(address.sin_port)) : 0;
  };
  std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> below(10000, std::max(10001, lowest_ephemeral - 1));
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (const int port = binds(below(random))) return port;
  }
  return binds(0);
}

inline std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// When `file` first contains `text` (`times` times), polled for at most `limit`; nothing if it
// never did.
inline std::optional<std::chrono::steady_clock::time_point> when_logged(
    const std::filesystem::path& file, const std::string& text, std::chrono::milliseconds limit,
    std::size_t times = 1) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string logged = read_file(file);
    std::size_t found = 0;
    for (auto at = logged.find(text); at != std::string::npos && found < times;
         at = logged.find(text, at + text.size())) {
      ++found;
    }
    if (found == times) return std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return std::nullopt;
}

// The names of cohort's shared-memory segments in /dev/shm (collective/detail/shared_segment.hpp),
// sorted: a job must leave none behind.
inline std::vector<std::string> shared_memory_segments() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("cohort-")) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The segments in /dev/shm now that were not in `before` (shared_memory_segments()), once the
// segments of jobs still starting have gone, waiting up to `settle`: a creator unlinks its
// segment as soon as every rank has mapped it, so a test beside others (ctest -j) sees theirs for
// moments, and one still there after `settle` was left behind.
inline std::vector<std::string> segments_left_since(
    const std::vector<std::string>& before,
    std::chrono::milliseconds settle = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + settle;
  for (;;) {
    std::vector<std::string> left;
    const std::vector<std::string> now = shared_memory_segments();
    std::set_difference(now.begin(), now.end(), before.begin(), before.end(),
                        std::back_inserter(left));
    if (left.empty() || std::chrono::steady_clock::now() >= deadline) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The child of `parent` (a launcher's rank) whose environment holds every one of `entries`
// ("COHORT_ROLE=ps", "COHORT_RANK=1").
inline std::optional<pid_t> child_with(pid_t parent, const std::vector<std::string>& entries) {
  const std::string task = "/proc/" + std::to_string(parent) + "/task/" + std::to_string(parent);
  std::ifstream children(task + "/children");
  for (pid_t child = 0; children >> child;) {
    std::ifstream environment("/proc/" + std::to_string(child) + "/environ");
    std::size_t held = 0;
    for (std::string variable; std::getline(environment, variable, '\0');) {
      if (std::find(entries.begin(), entries.end(), variable) != entries.end()) ++held;
    }
    if (held == entries.size()) return child;
  }
  return std::nullopt;
}

// Runs a command to completion, output in `log`; nothing if it outlives `limit` (then killed).
inline std::optional<std::pair<Exit, std::string>> run_to_completion(
    const std::vector<std::string>& command, const std::filesystem::path& log,
    const std::map<std::string, std::string>& env = {},
    std::chrono::milliseconds limit = std::chrono::seconds(120)) {
  Process process(command, env, log);
  const auto exit = process.wait(limit);
  if (!exit) return std::nullopt;
  return std::pair{*exit, read_file(log)};
}

struct TemporaryDirectory {
  std::filesystem::path path;
  explicit TemporaryDirectory(const std::string& name)
      : path(std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~TemporaryDirectory() { std::filesystem::remove_all(path); }
};

}  // namespace cohort::testing
