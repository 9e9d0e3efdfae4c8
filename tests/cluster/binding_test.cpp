#include "cohort/cluster/binding.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "cohort/collective/communication_thread.hpp"
#include "cohort/strategy/detail/environment_options.hpp"
#include "cohort/strategy/detail/tcp_options.hpp"
#include "error_message.hpp"

using cohort::testing::config_error_message;
using namespace cohort::cluster;

namespace {

// A host with the given interfaces, names and routes: route(x) is routes[x], else the first
// interface address.
struct FakeHost {
  std::set<std::string> interfaces{"127.0.0.1", "10.77.0.2"};
  std::map<std::string, std::string> names{
      {"localhost", "127.0.0.1"}, {"w0", "10.77.0.1"}, {"w1", "10.77.0.2"}, {"me", "127.0.1.1"}};
  std::map<std::string, std::string> routes{{"127.0.0.1", "127.0.0.1"}, {"10.77.0.1", "10.77.0.2"}};

  Probe probe() const {
    Probe probe;
    probe.resolve = [this](const std::string& host) -> std::optional<std::string> {
      if (const auto found = names.find(host); found != names.end()) return found->second;
      if (host.find_first_not_of("0123456789.:") == std::string::npos) return host;
      return std::nullopt;
    };
    probe.route = [this](const std::string& address, std::uint16_t) -> std::optional<std::string> {
      if (const auto found = routes.find(address); found != routes.end()) return found->second;
      return std::nullopt;
    };
    probe.is_local = [this](const std::string& address) { return interfaces.contains(address); };
    return probe;
  }
};

Binding decide(const Variables& variables, const FakeHost& host = {}, std::string_view given = "") {
  const Environment environment = environment_from(variables);
  return decide_binding(resolve({}, environment), given, "Options::bind_address", environment,
                        host.probe());
}

std::string tf_config(std::string_view workers, std::string_view type, int index) {
  return std::string(R"({"cluster":{"worker":[)") + std::string(workers) +
         R"(]},"task":{"type":")" + std::string(type) + R"(","index":)" + std::to_string(index) +
         "}}";
}

}  // namespace

TEST_CASE("a loopback cluster binds loopback, whatever the launcher") {
  const Binding alone = decide({});
  CHECK(alone.address == "127.0.0.1");
  CHECK(alone.origin == "every address of the cluster is loopback");
  CHECK(alone.loopback());
  const Binding hand = decide({{"COHORT_RANK", "1"}, {"COHORT_WORLD_SIZE", "4"}});
  CHECK(hand.address == "127.0.0.1");
  const Binding tf =
      decide({{"TF_CONFIG", tf_config(R"("localhost:2222","127.0.0.1:2223")", "worker", 1)}});
  CHECK(tf.address == "127.0.0.1");
  CHECK(!tf.wildcard);
}

TEST_CASE("a TF_CONFIG task binds its own entry's address where it is this host's") {
  const Binding binding = decide({{"TF_CONFIG", tf_config(R"("w0:2222","w1:2222")", "worker", 1)}});
  CHECK(binding.address == "10.77.0.2");
  CHECK(binding.own == "10.77.0.2");
  CHECK(binding.origin == "own address in TF_CONFIG worker[1]");
  CHECK(!binding.wildcard);
  CHECK(describe(binding) == "listening on 10.77.0.2 (own address in TF_CONFIG worker[1])");
}

TEST_CASE("MASTER_ADDR-style sources bind the local address of the route to the master") {
  const Binding cohort = decide(
      {{"COHORT_RANK", "1"}, {"COHORT_WORLD_SIZE", "4"}, {"COHORT_MASTER_ADDR", "10.77.0.1"}});
  CHECK(cohort.address == "10.77.0.2");
  CHECK(cohort.origin == "own address on the route to the master 10.77.0.1");
  const Binding torchrun =
      decide({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "w0"}, {"MASTER_PORT", "29500"}});
  CHECK(torchrun.address == "10.77.0.2");
  CHECK(torchrun.origin == "own address on the route to the master w0");
}

TEST_CASE("the wildcard where the own address is not this host's, with the reason") {
  FakeHost service;
  service.names["w1"] = "10.96.0.9";  // a Kubernetes service address, not headless
  const Binding binding =
      decide({{"TF_CONFIG", tf_config(R"("w0:2222","w1:2222")", "worker", 1)}}, service);
  CHECK(binding.address == "0.0.0.0");
  CHECK(binding.wildcard);
  CHECK(binding.origin ==
        "every interface: own address in TF_CONFIG worker[1] is 10.96.0.9, not an address of "
        "this host (a service address?)");

  // A host name that /etc/hosts maps to 127.0.1.1, in a cluster that spans hosts.
  const Binding named = decide({{"TF_CONFIG", tf_config(R"("me:2222","w0:2222")", "worker", 0)}});
  CHECK(named.address == "0.0.0.0");
  CHECK(named.origin ==
        "every interface: own address in TF_CONFIG worker[0] is loopback 127.0.1.1 while the "
        "cluster spans hosts");

  const Binding unresolved =
      decide({{"TF_CONFIG", tf_config(R"("w0:2222","nowhere:2222")", "worker", 1)}});
  CHECK(unresolved.address == "0.0.0.0");
  CHECK(unresolved.origin == "every interface: TF_CONFIG worker[1] 'nowhere' does not resolve");

  FakeHost unrouted;
  unrouted.routes.clear();
  const Binding no_route = decide(
      {{"COHORT_RANK", "1"}, {"COHORT_WORLD_SIZE", "2"}, {"COHORT_MASTER_ADDR", "10.77.0.1"}},
      unrouted);
  CHECK(no_route.address == "0.0.0.0");
  CHECK(no_route.origin == "every interface: no route to the master 10.77.0.1");
}

TEST_CASE("the program's bind address, then COHORT_BIND_ADDRESS, override the cluster") {
  const Variables across{{"COHORT_RANK", "1"},
                         {"COHORT_WORLD_SIZE", "2"},
                         {"COHORT_MASTER_ADDR", "10.77.0.1"},
                         {"COHORT_BIND_ADDRESS", "0.0.0.0"}};
  const Binding variable = decide(across);
  CHECK(variable.address == "0.0.0.0");
  CHECK(variable.origin == "COHORT_BIND_ADDRESS");
  CHECK(variable.own == "10.77.0.2");  // still known, for local ranks
  const Binding given = decide(across, {}, "10.77.0.2");
  CHECK(given.address == "10.77.0.2");
  CHECK(given.origin == "Options::bind_address");
}

TEST_CASE(
    "a later rank 0 may keep the job's rendezvous address where it is of its host: at that "
    "address, or on every interface where it binds them all; not where it is another host's") {
  FakeHost host;  // this is w1 (10.77.0.2)
  host.routes["10.77.0.2"] = "10.77.0.2";
  const auto here = [&](const Variables& variables) {
    const Environment environment = environment_from(variables);
    const Spec spec = resolve({}, environment);
    return rendezvous_address_here(
        spec, decide_binding(spec, "", "Options::bind_address", environment, host.probe()),
        host.probe());
  };
  // One host: every address is loopback.
  CHECK(here({{"COHORT_RANK", "1"}, {"COHORT_WORLD_SIZE", "4"}}) == "127.0.0.1");
  // The master is this host, named by its address.
  CHECK(here({{"COHORT_RANK", "1"},
              {"COHORT_WORLD_SIZE", "4"},
              {"COHORT_MASTER_ADDR", "10.77.0.2"}}) == "10.77.0.2");
  // The master is this host by a name that is 127.0.1.1 here: the others reach it on every
  // interface, where this rank listens.
  CHECK(here({{"COHORT_RANK", "1"},
              {"COHORT_WORLD_SIZE", "4"},
              {"COHORT_MASTER_ADDR", "me"},
              {"COHORT_BIND_ADDRESS", "0.0.0.0"}}) == "0.0.0.0");
  // The master is another host, or nowhere.
  CHECK(here({{"COHORT_RANK", "1"}, {"COHORT_WORLD_SIZE", "4"}, {"COHORT_MASTER_ADDR", "w0"}}) ==
        std::nullopt);
  CHECK(
      here({{"COHORT_RANK", "1"}, {"COHORT_WORLD_SIZE", "4"}, {"COHORT_MASTER_ADDR", "nowhere"}}) ==
      std::nullopt);
}

TEST_CASE("the system probe finds the route to loopback and this host's loopback interface") {
  const Probe probe = system_probe();
  CHECK(probe.resolve("127.0.0.1") == "127.0.0.1");
  CHECK(probe.route("127.0.0.1", 29500) == "127.0.0.1");
  CHECK(probe.is_local("127.0.0.1"));
  CHECK(!probe.is_local("192.0.2.77"));  // TEST-NET-1: never a local address
}

TEST_CASE("COHORT_TIMEOUT and COHORT_CONNECT_TIMEOUT replace the defaults the program left") {
  using namespace std::chrono_literals;
  struct Options {
    std::chrono::milliseconds connect_timeout{std::chrono::minutes(1)};
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  };
  using cohort::strategy::detail::with_environment;
  const Environment environment =
      environment_from({{"COHORT_TIMEOUT", "20"}, {"COHORT_CONNECT_TIMEOUT", "1500ms"}});
  const Options defaults = with_environment(Options{}, environment);
  CHECK(defaults.timeout == 20s);
  CHECK(defaults.connect_timeout == 1500ms);
  const Options chosen = with_environment(Options{.timeout = 7s}, environment);
  CHECK(chosen.timeout == 7s);
  CHECK(chosen.connect_timeout == 1500ms);
  CHECK(config_error_message([] {
          with_environment(Options{}, environment_from({{"COHORT_TIMEOUT", "soon"}}));
        }) ==
        "COHORT_TIMEOUT = \"soon\": expected a duration: seconds (30, 2.5) or 500ms, 30s, "
        "5min");
  CHECK(config_error_message([] {
          with_environment(Options{.timeout = 1s},
                           environment_from({{"COHORT_CONNECT_TIMEOUT", "0"}}));
        }) == "COHORT_CONNECT_TIMEOUT = \"0\": must be greater than 0");
}

TEST_CASE(
    "COHORT_SHARE_UPDATE_FROM sets the gradient's size from which workers share the update, "
    "where the program left it") {
  struct Options {
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    std::optional<std::size_t> share_update_from_bytes{};
  };
  using cohort::strategy::detail::with_environment;
  const Environment always = environment_from({{"COHORT_SHARE_UPDATE_FROM", "0"}});
  CHECK(with_environment(Options{}, always).share_update_from_bytes == 0);
  CHECK(!with_environment(Options{}, environment_from({})).share_update_from_bytes.has_value());
  CHECK(
      with_environment(Options{.share_update_from_bytes = 4096}, always).share_update_from_bytes ==
      4096);
  CHECK(config_error_message([] {
          with_environment(Options{}, environment_from({{"COHORT_SHARE_UPDATE_FROM", "-1"}}));
        }) == "COHORT_SHARE_UPDATE_FROM = \"-1\": expected a count, 0 or more");
  CHECK(config_error_message([] {
          with_environment(Options{}, environment_from({{"COHORT_SHARE_UPDATE_FROM", "1MiB"}}));
        }).starts_with("COHORT_SHARE_UPDATE_FROM = \"1MiB\""));
}

TEST_CASE("COHORT_COMMUNICATION_PRIORITY sets a communication thread's priority left at default") {
  using cohort::collective::ThreadPriority;
  struct Options {
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    ThreadPriority communication_priority = ThreadPriority::kAuto;
  };
  using cohort::strategy::detail::with_environment;
  const Environment normal = environment_from({{"COHORT_COMMUNICATION_PRIORITY", "normal"}});
  CHECK(with_environment(Options{}, normal).communication_priority == ThreadPriority::kNormal);
  CHECK(with_environment(Options{.communication_priority = ThreadPriority::kRealtime}, normal)
            .communication_priority == ThreadPriority::kRealtime);
  CHECK(
      with_environment(Options{}, environment_from({{"COHORT_COMMUNICATION_PRIORITY", "realtime"}}))
          .communication_priority == ThreadPriority::kRealtime);
  CHECK(with_environment(Options{}, environment_from({})).communication_priority ==
        ThreadPriority::kAuto);
  CHECK(
      config_error_message([] {
        with_environment(Options{}, environment_from({{"COHORT_COMMUNICATION_PRIORITY", "high"}}));
      }) == "COHORT_COMMUNICATION_PRIORITY = \"high\": expected auto, normal or realtime");
}

TEST_CASE("COHORT_SHARED_MEMORY=0 keeps processes of one host on TCP, where left at default") {
  struct Options {
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    bool shared_memory = true;
  };
  using cohort::strategy::detail::with_environment;
  const Environment off = environment_from({{"COHORT_SHARED_MEMORY", "0"}});
  CHECK_FALSE(with_environment(Options{}, off).shared_memory);
  CHECK(
      with_environment(Options{}, environment_from({{"COHORT_SHARED_MEMORY", "1"}})).shared_memory);
  CHECK(with_environment(Options{}, environment_from({})).shared_memory);
  // The program's choice wins: false stays false under 1.
  CHECK_FALSE(with_environment(Options{.shared_memory = false},
                               environment_from({{"COHORT_SHARED_MEMORY", "1"}}))
                  .shared_memory);
  CHECK(config_error_message([] {
          with_environment(Options{}, environment_from({{"COHORT_SHARED_MEMORY", "no"}}));
        }) == "COHORT_SHARED_MEMORY = \"no\": expected 0 or 1");
}

TEST_CASE("COHORT_ENCRYPT turns encryption on, takes 0 or 1 and requires the secret") {
  struct Options {
    std::string bind_address{};
    std::string secret{};
    std::string listen_ports{};
    std::chrono::milliseconds connect_timeout{std::chrono::minutes(1)};
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  };
  const Spec spec = resolve({}, environment_from({}));
  const auto encrypts = [&](const char* value, const std::string& secret) {
    ::setenv("COHORT_ENCRYPT", value, 1);
    const auto unset = [] { ::unsetenv("COHORT_ENCRYPT"); };
    try {
      const bool on =
          cohort::strategy::detail::tcp_options(spec, 0, 1, Options{.secret = secret}).encrypt;
      unset();
      return on;
    } catch (...) {
      unset();
      throw;
    }
  };
  CHECK(encrypts("1", "s3cret"));
  CHECK_FALSE(encrypts("0", "s3cret"));
  CHECK_FALSE(encrypts("", "s3cret"));
  CHECK(config_error_message([&] { encrypts("yes", "s3cret"); }) ==
        "COHORT_ENCRYPT = \"yes\": expected 0 or 1");
  ::unsetenv("COHORT_SECRET");
  CHECK(config_error_message([&] { encrypts("1", ""); }) ==
        "COHORT_ENCRYPT = \"1\": requires a secret: set COHORT_SECRET (or the strategy's "
        "Options::secret) to the same value on every rank");
}

TEST_CASE("parse_duration reads seconds and the units ms, s and min") {
  using namespace std::chrono_literals;
  CHECK(parse_duration("COHORT_TIMEOUT", "30") == 30s);
  CHECK(parse_duration("COHORT_TIMEOUT", "2.5") == 2500ms);
  CHECK(parse_duration("COHORT_TIMEOUT", "500ms") == 500ms);
  CHECK(parse_duration("COHORT_TIMEOUT", "30s") == 30s);
  CHECK(parse_duration("COHORT_TIMEOUT", "5min") == 5min);
  CHECK(parse_duration("COHORT_TIMEOUT", "0.0001") == 1ms);
  CHECK(config_error_message([] { parse_duration("COHORT_TIMEOUT", "-1"); }) ==
        "COHORT_TIMEOUT = \"-1\": must be greater than 0");
  CHECK(config_error_message([] { parse_duration("COHORT_TIMEOUT", "1h"); }) ==
        "COHORT_TIMEOUT = \"1h\": expected a duration: seconds (30, 2.5) or 500ms, 30s, 5min");
  CHECK(config_error_message([] { parse_duration("COHORT_TIMEOUT", "nan"); }) ==
        "COHORT_TIMEOUT = \"nan\": expected a duration: seconds (30, 2.5) or 500ms, 30s, 5min");
  CHECK(config_error_message([] { parse_duration("COHORT_TIMEOUT", "1e9"); }) ==
        "COHORT_TIMEOUT = \"1e9\": must be at most a week");
}

TEST_CASE("a launch without local ranks says they come from the rendezvous") {
  const Spec hand = resolve({}, environment_from({{"COHORT_RANK", "1"},
                                                  {"COHORT_WORLD_SIZE", "4"},
                                                  {"COHORT_MASTER_ADDR", "10.77.0.1"}}));
  CHECK(!hand.local_given);
  CHECK(describe(hand) ==
        "rank 1 of 4 (local from the rendezvous), role worker, master 10.77.0.1:29500, no job "
        "id, from COHORT_* variables");
  const Spec given = resolve({}, environment_from({{"COHORT_RANK", "1"},
                                                   {"COHORT_WORLD_SIZE", "4"},
                                                   {"COHORT_LOCAL_RANK", "1"},
                                                   {"COHORT_LOCAL_WORLD_SIZE", "2"},
                                                   {"COHORT_MASTER_ADDR", "10.77.0.1"}}));
  CHECK(given.local_given);
  const Spec alone = resolve({}, environment_from({}));
  CHECK(alone.local_given);
}
