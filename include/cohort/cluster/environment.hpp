// The environment the cluster resolver reads, and the parsers of its values.
//
// Environment is a function from a variable's name to its value (nullopt when it is not set), so
// that tests pass a map and programs pass process_environment(). Every parser here throws a
// ConfigError that names the variable and the value it was given, in the form
//
//   RANK = "two": not an integer
//   MASTER_PORT = 70000: out of range: a port lies in [1, 65535]
//
// The variable names cohort's own launcher sets (cohort-run, or a user by hand) are constants of
// namespace variable, so that the launcher and the resolver cannot spell them differently.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "cohort/core/compilation.hpp"
#include "cohort/core/error.hpp"

namespace cohort::cluster {

// The value of a variable, or nullopt when it is not set. The resolver treats a variable set to
// the empty string as not set, so `export RANK=` clears it.
using Environment = std::function<std::optional<std::string>(std::string_view name)>;

// The variables of this process, read with getenv at each call.
COHORT_DECL Environment process_environment();

using Variables = std::map<std::string, std::string, std::less<>>;

// A fixed set of variables, for tests and for programs that take their description from a file.
COHORT_DECL Environment environment_from(Variables variables);

// The variables cohort's own launch description uses (docs/launching.md).
namespace variable {
inline constexpr std::string_view kRank = "COHORT_RANK";
inline constexpr std::string_view kWorldSize = "COHORT_WORLD_SIZE";
inline constexpr std::string_view kLocalRank = "COHORT_LOCAL_RANK";
inline constexpr std::string_view kLocalWorldSize = "COHORT_LOCAL_WORLD_SIZE";
inline constexpr std::string_view kMasterAddr = "COHORT_MASTER_ADDR";
inline constexpr std::string_view kMasterPort = "COHORT_MASTER_PORT";
inline constexpr std::string_view kJobId = "COHORT_JOB_ID";
inline constexpr std::string_view kBindAddress = "COHORT_BIND_ADDRESS";
inline constexpr std::string_view kSecret = "COHORT_SECRET";
inline constexpr std::string_view kEncrypt = "COHORT_ENCRYPT";
inline constexpr std::string_view kTimeout = "COHORT_TIMEOUT";
inline constexpr std::string_view kConnectTimeout = "COHORT_CONNECT_TIMEOUT";
inline constexpr std::string_view kPortRange = "COHORT_PORT_RANGE";
inline constexpr std::string_view kCommunicationPriority = "COHORT_COMMUNICATION_PRIORITY";
inline constexpr std::string_view kSharedMemory = "COHORT_SHARED_MEMORY";
inline constexpr std::string_view kWire = "COHORT_WIRE";
inline constexpr std::string_view kShareUpdateFrom = "COHORT_SHARE_UPDATE_FROM";
inline constexpr std::string_view kMinWorkers = "COHORT_MIN_WORKERS";
inline constexpr std::string_view kMaxWorkers = "COHORT_MAX_WORKERS";
// 1: this process joins a running elastic job through its door (a worker started again, whatever
// its COHORT_RANK: strategy/elastic.hpp); 0 or unset: it starts the job with the others
// (parse_switch). cohort-run sets it on the ranks it starts again.
inline constexpr std::string_view kJoin = "COHORT_JOIN";
// The job's hosts, comma-separated ("h1,h2,h3"): where a process that joins looks for the job's
// door after COHORT_MASTER_ADDR, at COHORT_MASTER_PORT (cluster::Spec::hosts). TF_CONFIG and
// Slurm's allocation give it without this.
inline constexpr std::string_view kHosts = "COHORT_HOSTS";
// Roles of a parameter-server job (strategy/parameter_server.hpp). COHORT_ROLE is "worker" (the
// default), "chief" or "ps"; COHORT_RANK and COHORT_WORLD_SIZE then count the processes of that
// role only (chief and workers together), as TF_CONFIG's task index does. A worker learns the
// number of servers from COHORT_PS_COUNT, a server the number of workers from
// COHORT_WORKER_COUNT. cohort-run --ps N sets all three.
inline constexpr std::string_view kRole = "COHORT_ROLE";
inline constexpr std::string_view kPsCount = "COHORT_PS_COUNT";
inline constexpr std::string_view kWorkerCount = "COHORT_WORKER_COUNT";
// The variables above: what describes a rank's place in a job. The other COHORT_* variables
// are settings every rank shares (and COHORT_TRACE):
//   COHORT_BIND_ADDRESS     where this process listens (cluster/binding.hpp chooses without it)
//   COHORT_SECRET           the job's shared secret (transport/tcp/options.hpp)
//   COHORT_ENCRYPT          1: data frames travel encrypted (tcp::Options::encrypt; requires
//                           the secret); 0 or unset: they do not (parse_switch)
//   COHORT_TIMEOUT          a strategy's Options::timeout, where the program leaves its default
//   COHORT_CONNECT_TIMEOUT  a strategy's Options::connect_timeout, likewise
//   COHORT_PORT_RANGE       LOW-HIGH: the ports the ranks other than 0 and the servers listen in,
//                           for a firewall (parse_port_range); unset, any free port
//   COHORT_COMMUNICATION_PRIORITY
//                           auto, normal or realtime: a strategy's Options::communication_priority
//                           (collective/communication_thread.hpp), where the program leaves its
//                           default
//   COHORT_SHARED_MEMORY    0: the worker processes of one host all-reduce over TCP, not through
//                           shared memory (MultiWorkerMirrored's Options::shared_memory, where the
//                           program leaves its default; parse_switch)
//   COHORT_WIRE             fp32, bf16 or fp16: the format the gradient crosses between
//                           processes in (MultiWorkerMirrored's and ParameterServer's
//                           Options::wire, collective/wire.hpp), where the program leaves its
//                           default
//   COHORT_SHARE_UPDATE_FROM
//                           bytes: the gradient's size from which MultiWorkerMirrored's workers
//                           share the optimizer's update (Options::share_update_from_bytes),
//                           where the program leaves it unset
// The two timeouts are durations (parse_duration): "30" or "30s", "500ms", "5min".
inline constexpr std::array kCohortDescription = {
    kRank,  kWorldSize, kLocalRank, kLocalWorldSize, kMasterAddr, kMasterPort,
    kJobId, kRole,      kPsCount,   kWorkerCount,    kJoin,       kHosts};

// The variables by which other launchers (torchrun, Open MPI, the TensorFlow training operator)
// give a rank and a world size. A launcher that defines its children's world itself, as
// cohort-run does, removes them from the children's environment: they describe the launch around
// it, and the resolver would refuse the disagreement.
inline constexpr std::array<std::string_view, 9> kOtherLaunchers = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "TF_CONFIG",
};
}  // namespace variable

// The port rendezvous uses when no source gives one: torchrun's default.
inline constexpr std::uint16_t kDefaultMasterPort = 29500;

namespace detail {

// "name = "value": requirement", the value quoted (and shortened) since it is raw text.
[[noreturn]] COHORT_DECL void reject_text(std::string_view name, std::string_view value,
                                          std::string_view requirement);

[[noreturn]] COHORT_DECL void reject_number(std::string_view name, long long value,
                                            std::string_view requirement);

COHORT_DECL bool is_host_character(char c);

}  // namespace detail

// An integer in decimal, nothing before or after it.
COHORT_DECL int parse_integer(std::string_view name, std::string_view value);

// A TCP port for a listener others connect to: 1 to 65535.
COHORT_DECL std::uint16_t require_port(std::string_view name, long long port);

COHORT_DECL std::uint16_t parse_port(std::string_view name, std::string_view value);

// A switch: "0" (off) or "1" (on).
COHORT_DECL bool parse_switch(std::string_view name, std::string_view value);

// A duration: a decimal number of seconds ("30", "2.5"), or a number with a unit: "ms", "s",
// "min" ("500ms", "30s", "5min"). Positive and at most a week; rounded to milliseconds, and at
// least 1 ms.
COHORT_DECL std::chrono::milliseconds parse_duration(std::string_view name, std::string_view value);

// The ports LOW-HIGH of COHORT_PORT_RANGE (or a strategy's Options::listen_ports), "29510-29599";
// a ConfigError naming `name` for anything else.
struct PortRange {
  std::uint16_t first = 0;
  std::uint16_t last = 0;
};
COHORT_DECL PortRange parse_port_range(std::string_view name, std::string_view value);

// A host name, an IPv4 address, or an IPv6 address (with or without brackets). Returns the host
// without brackets. Checks the spelling only; check_resolvable asks the resolver.
COHORT_DECL std::string parse_host(std::string_view name, std::string_view value);

struct HostPort {
  std::string host;  // without brackets
  std::uint16_t port = 0;

  friend bool operator==(const HostPort&, const HostPort&) = default;
};

// "host:port", "10.0.0.1:2222" or "[fd00::1]:2222" (IPv6 addresses need the brackets).
COHORT_DECL HostPort parse_host_port(std::string_view name, std::string_view value);

// "host:port", with brackets around an IPv6 address.
COHORT_DECL std::string format_host_port(std::string_view host, std::uint16_t port);

// Asks the system resolver (getaddrinfo: /etc/hosts, DNS) whether host has an address; throws a
// ConfigError naming `name` and the host if not. Blocks for as long as the resolver takes.
COHORT_DECL void check_resolvable(std::string_view name, std::string_view host);

}  // namespace cohort::cluster

#if !defined(COHORT_SEPARATE_COMPILATION)
#include "cohort/cluster/impl/environment.ipp"
#endif
