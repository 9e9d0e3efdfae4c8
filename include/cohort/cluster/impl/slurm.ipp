// Definitions for cohort/cluster/slurm.hpp (core/compilation.hpp says where they compile).
#pragma once

#include "cohort/cluster/slurm.hpp"

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "cohort/cluster/environment.hpp"

namespace cohort::cluster {

namespace detail {

[[noreturn]] COHORT_DECL void reject_at(std::string_view name, std::string_view value,
                                        std::size_t position, std::string_view what) {
  reject_text(name, value, std::string(what) + " at position " + std::to_string(position));
}

COHORT_DECL bool is_digit(char c) { return c >= '0' && c <= '9'; }

// One bracket group "01-03,07" as its numbers, already formatted.
COHORT_DECL std::vector<std::string> expand_group(std::string_view name, std::string_view value,
                                                  std::size_t group_start, std::string_view group) {
  std::vector<std::string> numbers;
  std::size_t position = 0;
  while (true) {
    const std::size_t comma = group.find(',', position);
    const std::string_view entry =
        group.substr(position, comma == std::string_view::npos ? group.npos : comma - position);
    const std::size_t at = group_start + position;
    if (entry.empty()) reject_at(name, value, at, "empty entry in brackets");
    const std::size_t dash = entry.find('-');
    const std::string_view low = entry.substr(0, dash);
    const std::string_view high = dash == std::string_view::npos ? low : entry.substr(dash + 1);
    for (const std::string_view part : {low, high}) {
      if (part.empty() || part.size() > 18)
        reject_at(name, value, at, "expected a number or lo-hi");
      for (const char c : part) {
        if (!is_digit(c)) reject_at(name, value, at, "expected a number or lo-hi");
      }
    }
    std::uint64_t from = 0;
    std::uint64_t to = 0;
    std::from_chars(low.data(), low.data() + low.size(), from);
    std::from_chars(high.data(), high.data() + high.size(), to);
    if (from > to) reject_at(name, value, at, "descending range");
    if (to - from >= kMaxExpandedNodes - numbers.size()) {
      reject_text(name, value,
                  "expands to more than " + std::to_string(kMaxExpandedNodes) + " hosts");
    }
    for (std::uint64_t n = from; n <= to; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < low.size()) digits.insert(0, low.size() - digits.size(), '0');
      numbers.push_back(std::move(digits));
    }
    if (comma == std::string_view::npos) break;
    position = comma + 1;
  }
  return numbers;
}

// One host expression "rack[1-2]-n[1-2]", appended to hosts.
COHORT_DECL void expand_host(std::string_view name, std::string_view value, std::size_t start,
                             std::string_view expression, std::vector<std::string>& hosts) {
  if (expression.empty()) reject_at(name, value, start, "empty host name");
  // Alternating text and groups: text[0] group[0] text[1] group[1] ... text[n].
  std::vector<std::string_view> texts;
  std::vector<std::vector<std::string>> groups;
  std::size_t position = 0;
  while (true) {
    const std::size_t open = expression.find('[', position);
    texts.push_back(
        expression.substr(position, open == expression.npos ? expression.npos : open - position));
    if (open == std::string_view::npos) break;
    const std::size_t close = expression.find(']', open);  // the caller checked balance
    groups.push_back(
        expand_group(name, value, start + open + 1, expression.substr(open + 1, close - open - 1)));
    position = close + 1;
  }
  std::size_t count = 1;
  for (const auto& group : groups) {
    count *= group.size();
    if (count + hosts.size() > kMaxExpandedNodes) {
      reject_text(name, value,
                  "expands to more than " + std::to_string(kMaxExpandedNodes) + " hosts");
    }
  }
  // Odometer over the groups, the last group varying fastest.
  std::vector<std::size_t> digit(groups.size(), 0);
  for (std::size_t produced = 0; produced < count; ++produced) {
    std::string host(texts[0]);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      host += groups[g][digit[g]];
      host += texts[g + 1];
    }
    hosts.push_back(std::move(host));
    for (std::size_t g = groups.size(); g-- > 0;) {
      if (++digit[g] < groups[g].size()) break;
      digit[g] = 0;
    }
  }
}

}  // namespace detail

COHORT_DECL std::vector<std::string> expand_node_list(std::string_view value,
                                                      std::string_view name) {
  if (value.empty()) detail::reject_text(name, value, "empty node list");
  std::vector<std::string> hosts;
  std::size_t item_start = 0;
  bool in_brackets = false;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const char c = value[i];
    if (c == '[') {
      if (in_brackets) detail::reject_at(name, value, i, "nested '['");
      in_brackets = true;
    } else if (c == ']') {
      if (!in_brackets) detail::reject_at(name, value, i, "']' without '['");
      in_brackets = false;
    } else if (c == ',' && !in_brackets) {
      detail::expand_host(name, value, item_start, value.substr(item_start, i - item_start), hosts);
      item_start = i + 1;
    } else if (!in_brackets && !detail::is_host_character(c)) {
      detail::reject_at(name, value, i, std::string("unexpected character '") + c + "'");
    }  // inside brackets, expand_group checks the characters
  }
  if (in_brackets) detail::reject_at(name, value, value.rfind('['), "unclosed '['");
  detail::expand_host(name, value, item_start, value.substr(item_start), hosts);
  return hosts;
}

COHORT_DECL std::vector<int> expand_tasks_per_node(std::string_view value, std::string_view name) {
  std::vector<int> tasks;
  std::size_t position = 0;
  while (true) {
    const std::size_t comma = value.find(',', position);
    const std::string_view item =
        value.substr(position, comma == std::string_view::npos ? value.npos : comma - position);
    int count = 0;
    int repeat = 1;
    const char* const first = item.data();
    const char* const last = item.data() + item.size();
    auto [end, error] = std::from_chars(first, last, count);
    if (error == std::errc{} && end != last) {
      // "(xM)"
      if (last - end < 4 || end[0] != '(' || end[1] != 'x' || last[-1] != ')') {
        end = first;  // malformed
      } else {
        auto [repeat_end, repeat_error] = std::from_chars(end + 2, last - 1, repeat);
        end = (repeat_error == std::errc{} && repeat_end == last - 1) ? last : first;
      }
    }
    if (item.empty() || error != std::errc{} || end != last || count < 1 || repeat < 1 ||
        tasks.size() + static_cast<std::size_t>(repeat) > kMaxExpandedNodes) {
      detail::reject_at(name, value, position, "expected N or N(xM), N and M at least 1");
    }
    tasks.insert(tasks.end(), static_cast<std::size_t>(repeat), count);
    if (comma == std::string_view::npos) break;
    position = comma + 1;
  }
  return tasks;
}

}  // namespace cohort::cluster
