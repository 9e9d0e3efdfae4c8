#include "cohort/cluster/slurm.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "error_message.hpp"

using cohort::cluster::expand_node_list;
using cohort::cluster::expand_tasks_per_node;
using cohort::testing::config_error_message;
using Hosts = std::vector<std::string>;

namespace {

std::string node_list_error(const std::string& list) {
  return config_error_message([&] { expand_node_list(list, "SLURM_JOB_NODELIST"); });
}

}  // namespace

TEST_CASE("expand_node_list keeps plain names and lists as they are") {
  CHECK(expand_node_list("node1") == Hosts{"node1"});
  CHECK(expand_node_list("a,b.example.org,c_1") == Hosts{"a", "b.example.org", "c_1"});
  CHECK(expand_node_list("b,a,b") == Hosts{"b", "a", "b"});  // order and duplicates kept
}

TEST_CASE("expand_node_list expands ranges and lists in brackets, keeping zero padding") {
  CHECK(expand_node_list("node[1-3]") == Hosts{"node1", "node2", "node3"});
  CHECK(expand_node_list("node[01-03,07]") == Hosts{"node01", "node02", "node03", "node07"});
  CHECK(expand_node_list("n[08-11]") == Hosts{"n08", "n09", "n10", "n11"});
  CHECK(expand_node_list("n[9-11]") == Hosts{"n9", "n10", "n11"});
  CHECK(expand_node_list("n[001-3]") == Hosts{"n001", "n002", "n003"});
  CHECK(expand_node_list("n[5]") == Hosts{"n5"});
  CHECK(expand_node_list("n[3,1]") == Hosts{"n3", "n1"});
  CHECK(expand_node_list("[1-2]x") == Hosts{"1x", "2x"});
}

TEST_CASE("expand_node_list multiplies several bracket groups, the first varying slowest") {
  CHECK(expand_node_list("rack[1-2]-n[1-2]") ==
        Hosts{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"});
  CHECK(expand_node_list("node[01-03,07],gpu5,rack[1-2]-n[1-2]") ==
        Hosts{"node01", "node02", "node03", "node07", "gpu5", "rack1-n1", "rack1-n2", "rack2-n1",
              "rack2-n2"});
  CHECK(expand_node_list("r[1-2]c[0-1]s[7]") == Hosts{"r1c0s7", "r1c1s7", "r2c0s7", "r2c1s7"});
}

TEST_CASE("expand_node_list names the variable, the value and the position of what is wrong") {
  CHECK(node_list_error("") == "SLURM_JOB_NODELIST = \"\": empty node list");
  CHECK(node_list_error("node[01-") ==
        "SLURM_JOB_NODELIST = \"node[01-\": unclosed '[' at position 4");
  CHECK(node_list_error("node]1") ==
        "SLURM_JOB_NODELIST = \"node]1\": ']' without '[' at position 4");
  CHECK(node_list_error("n[[1]]") == "SLURM_JOB_NODELIST = \"n[[1]]\": nested '[' at position 2");
  CHECK(node_list_error("n[3-1]") ==
        "SLURM_JOB_NODELIST = \"n[3-1]\": descending range at position 2");
  CHECK(node_list_error("n[a-b]") ==
        "SLURM_JOB_NODELIST = \"n[a-b]\": expected a number or lo-hi at position 2");
  CHECK(node_list_error("n[1-]") ==
        "SLURM_JOB_NODELIST = \"n[1-]\": expected a number or lo-hi at position 2");
  CHECK(node_list_error("n[1,,2]") ==
        "SLURM_JOB_NODELIST = \"n[1,,2]\": empty entry in brackets at position 4");
  CHECK(node_list_error("n[]") ==
        "SLURM_JOB_NODELIST = \"n[]\": empty entry in brackets at position 2");
  CHECK(node_list_error("a,,b") == "SLURM_JOB_NODELIST = \"a,,b\": empty host name at position 2");
  CHECK(node_list_error("a,") == "SLURM_JOB_NODELIST = \"a,\": empty host name at position 2");
  CHECK(node_list_error("a b") ==
        "SLURM_JOB_NODELIST = \"a b\": unexpected character ' ' at position 1");
  CHECK(node_list_error("n[0-99999999]") ==
        "SLURM_JOB_NODELIST = \"n[0-99999999]\": expands to more than 1048576 hosts");
  CHECK(node_list_error("a[0-1023]b[0-1023]c[0-1]") ==
        "SLURM_JOB_NODELIST = \"a[0-1023]b[0-1023]c[0-1]\": expands to more than 1048576 hosts");
}

TEST_CASE("expand_tasks_per_node expands N(xM) repeats") {
  CHECK(expand_tasks_per_node("4") == std::vector<int>{4});
  CHECK(expand_tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(expand_tasks_per_node("1,3(x2)") == std::vector<int>{1, 3, 3});
  for (const std::string bad : {"", "x", "0", "2(x)", "2(x3", "2(y3)", "2(x0)", "1,,2", "-1"}) {
    CAPTURE(bad);
    CHECK(cohort::testing::contains(
        config_error_message([&] { expand_tasks_per_node(bad); }),
        "SLURM_TASKS_PER_NODE = \"" + bad + "\": expected N or N(xM), N and M at least 1"));
  }
}
