// The definitions of settings.hpp (core/compilation.hpp).
#pragma once

#include "cohort/core/settings.hpp"

namespace cohort::settings {

namespace detail {

// The words of "a=1 b=2" that differ first, as {name, value in left, value in right}; the whole
// texts when they are not such lists of the same names.
struct Difference {
  std::string name, left, right;
};

COHORT_DECL std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (begin < text.size()) {
    const std::size_t end = std::min(text.find(' ', begin), text.size());
    if (end > begin) out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

COHORT_DECL Difference difference(const std::string& field, const std::string& left,
                                  const std::string& right) {
  const std::vector<std::string> a = words(left), b = words(right);
  if (a.size() == b.size()) {
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i] == b[i]) continue;
      const std::size_t ea = a[i].find('='), eb = b[i].find('=');
      if (ea == std::string::npos || eb == std::string::npos ||
          a[i].substr(0, ea) != b[i].substr(0, eb)) {
        break;
      }
      return {field + " " + a[i].substr(0, ea), a[i].substr(ea + 1), b[i].substr(eb + 1)};
    }
  }
  return {field, left, right};
}

COHORT_DECL std::string refusal(const std::string& field, const std::string& left,
                                std::string_view left_who, const std::string& right,
                                std::string_view right_who) {
  const Difference differs = difference(field, left, right);
  return "the processes of this job run with different settings, refused before the first step: " +
         differs.name + " is " + differs.left + " on " + std::string(left_who) + " but " +
         differs.right + " on " + std::string(right_who) +
         "; every process of a job must be given the same settings";
}

}  // namespace detail

COHORT_DECL std::vector<std::byte> encode(const Fields& fields) {
  std::vector<std::byte> bytes;
  const auto put = [&](std::string_view text) {
    for (const char c : text.substr(0, kValueChars)) bytes.push_back(static_cast<std::byte>(c));
    bytes.push_back(std::byte{0});
  };
  for (const Field& field : fields) {
    put(field.name);
    put(field.value);
  }
  return bytes;
}

COHORT_DECL std::optional<Fields> decode(std::span<const std::byte> bytes) {
  if (bytes.size() > kMaxEncodedBytes) return std::nullopt;
  std::vector<std::string> texts(1);
  for (const std::byte byte : bytes) {
    if (byte == std::byte{0}) {
      texts.emplace_back();
    } else {
      texts.back().push_back(static_cast<char>(byte));
    }
  }
  if (!texts.back().empty() || texts.size() % 2 != 1) return std::nullopt;
  Fields fields;
  for (std::size_t i = 0; i + 1 < texts.size(); i += 2) fields.push_back({texts[i], texts[i + 1]});
  return fields;
}

COHORT_DECL Reference::Reference(const Fields& own, std::string_view holder) {
  // Cut as encode cuts what the others send, so that the same settings compare equal.
  for (const Field& field : own) {
    held_.push_back({{field.name.substr(0, kValueChars), field.value.substr(0, kValueChars)},
                     std::string(holder)});
  }
}

COHORT_DECL std::string Reference::compare(const Fields& theirs, std::string_view who) {
  for (const Held& held : held_) {
    const auto found = std::find_if(theirs.begin(), theirs.end(), [&](const Field& field) {
      return field.name == held.field.name;
    });
    const std::string value = found != theirs.end() ? found->value : std::string("not given");
    if (value != held.field.value) {
      return detail::refusal(held.field.name, held.field.value, held.holder, value, who);
    }
  }
  for (const Field& field : theirs) {
    const bool known = std::any_of(held_.begin(), held_.end(),
                                   [&](const Held& held) { return held.field.name == field.name; });
    if (!known) held_.push_back({field, std::string(who)});
  }
  return {};
}

}  // namespace cohort::settings
