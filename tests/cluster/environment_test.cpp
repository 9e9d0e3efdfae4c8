#include "cohort/cluster/environment.hpp"

#include <doctest/doctest.h>
#include <stdlib.h>

#include "error_message.hpp"

using cohort::testing::config_error_message;
using namespace cohort::cluster;

TEST_CASE("parse_integer takes decimal integers only and names the variable and the value") {
  CHECK(parse_integer("RANK", "0") == 0);
  CHECK(parse_integer("RANK", "17") == 17);
  CHECK(parse_integer("RANK", "-3") == -3);
  CHECK(config_error_message([] { parse_integer("RANK", "two"); }) ==
        "RANK = \"two\": not an integer");
  CHECK(config_error_message([] { parse_integer("RANK", "1.5"); }) ==
        "RANK = \"1.5\": not an integer");
  CHECK(config_error_message([] { parse_integer("RANK", " 1"); }) ==
        "RANK = \" 1\": not an integer");
  CHECK(config_error_message([] { parse_integer("RANK", "3 "); }) ==
        "RANK = \"3 \": not an integer");
  CHECK(config_error_message([] { parse_integer("WORLD_SIZE", "99999999999"); }) ==
        "WORLD_SIZE = \"99999999999\": out of range for an int");
}

TEST_CASE("parse_port accepts 1 to 65535") {
  CHECK(parse_port("MASTER_PORT", "1") == 1);
  CHECK(parse_port("MASTER_PORT", "65535") == 65535);
  CHECK(config_error_message([] { parse_port("MASTER_PORT", "0"); }) ==
        "MASTER_PORT = 0: out of range: a port lies in [1, 65535]");
  CHECK(config_error_message([] { parse_port("MASTER_PORT", "70000"); }) ==
        "MASTER_PORT = 70000: out of range: a port lies in [1, 65535]");
  CHECK(config_error_message([] { parse_port("MASTER_PORT", "http"); }) ==
        "MASTER_PORT = \"http\": not an integer");
}

TEST_CASE("parse_port_range takes LOW-HIGH and names the variable for anything else") {
  const auto range = cohort::cluster::parse_port_range("COHORT_PORT_RANGE", "29510-29599");
  CHECK(range.first == 29510);
  CHECK(range.last == 29599);
  CHECK(cohort::cluster::parse_port_range("COHORT_PORT_RANGE", "7-7").last == 7);
  for (const char* bad : {"29510", "10-5", "0-10", "1-70000", "a-b", "1-", "-2"}) {
    CAPTURE(bad);
    CHECK(config_error_message([&] { cohort::cluster::parse_port_range("COHORT_PORT_RANGE", bad); })
              .find("COHORT_PORT_RANGE = \"" + std::string(bad) +
                    "\": expected LOW-HIGH, two ports in [1, 65535], LOW <= HIGH") == 0);
  }
}

TEST_CASE("parse_host accepts names, IPv4 and IPv6 addresses, and refuses the rest") {
  CHECK(parse_host("MASTER_ADDR", "node-01.cluster.local") == "node-01.cluster.local");
  CHECK(parse_host("MASTER_ADDR", "10.0.0.7") == "10.0.0.7");
  CHECK(parse_host("MASTER_ADDR", "fd00::1") == "fd00::1");
  CHECK(parse_host("MASTER_ADDR", "[fd00::1]") == "fd00::1");
  CHECK(config_error_message([] { parse_host("MASTER_ADDR", "node 1"); }) ==
        "MASTER_ADDR = \"node 1\": not a host name or address");
  CHECK(config_error_message([] { parse_host("MASTER_ADDR", "tcp://node1"); }) ==
        "MASTER_ADDR = \"tcp://node1\": not a host name or address");
  CHECK(config_error_message([] { parse_host("MASTER_ADDR", "[]"); }) ==
        "MASTER_ADDR = \"[]\": empty host name");
}

TEST_CASE("parse_host_port splits host:port, with brackets around IPv6") {
  CHECK(parse_host_port("w", "node1:2222") == HostPort{"node1", 2222});
  CHECK(parse_host_port("w", "10.0.0.1:1") == HostPort{"10.0.0.1", 1});
  CHECK(parse_host_port("w", "[fd00::1]:2222") == HostPort{"fd00::1", 2222});
  CHECK(config_error_message([] { parse_host_port("w", "node1"); }) ==
        "w = \"node1\": expected host:port");
  CHECK(config_error_message([] { parse_host_port("w", "node1:"); }) ==
        "w = \"node1:\": expected host:port");
  CHECK(config_error_message([] { parse_host_port("w", ":2222"); }) ==
        "w = \":2222\": empty host name");
  CHECK(config_error_message([] { parse_host_port("w", "node1:http"); }) ==
        "w = \"node1:http\": expected host:port with a numeric port");
  CHECK(config_error_message([] { parse_host_port("w", "node1:0"); }) ==
        "w = \"node1:0\": port out of range: a port lies in [1, 65535]");
  CHECK(config_error_message([] { parse_host_port("w", "fd00::1:2222"); }) ==
        "w = \"fd00::1:2222\": expected host:port; write an IPv6 address in brackets");
}

TEST_CASE("format_host_port puts brackets around IPv6 addresses only") {
  CHECK(format_host_port("node1", 29500) == "node1:29500");
  CHECK(format_host_port("fd00::1", 29500) == "[fd00::1]:29500");
}

TEST_CASE("environment_from and process_environment read variables, nullopt when unset") {
  const Environment fake = environment_from({{"RANK", "3"}, {"EMPTY", ""}});
  CHECK(fake("RANK") == "3");
  CHECK(fake("EMPTY") == "");
  CHECK(fake("WORLD_SIZE") == std::nullopt);

  ::setenv("COHORT_TEST_ENVIRONMENT_VARIABLE", "value", 1);
  const Environment real = process_environment();
  CHECK(real("COHORT_TEST_ENVIRONMENT_VARIABLE") == "value");
  ::unsetenv("COHORT_TEST_ENVIRONMENT_VARIABLE");
  CHECK(real("COHORT_TEST_ENVIRONMENT_VARIABLE") == std::nullopt);
}

TEST_CASE("check_resolvable finds localhost and names a host that does not resolve") {
  CHECK_NOTHROW(check_resolvable("master address", "localhost"));
  CHECK_NOTHROW(check_resolvable("master address", "127.0.0.1"));
  const std::string message =
      config_error_message([] { check_resolvable("workers[1]", "no-such-host.invalid"); });
  CHECK(message.starts_with("workers[1] = \"no-such-host.invalid\": does not resolve: "));
}
