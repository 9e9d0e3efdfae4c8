// One fuzz input read as a sequence of choices, for targets that build structured values (files,
// environments) from it. Past the end every field reads as zero or empty, so that every input,
// however short, is some complete sequence of choices.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace cohort::fuzz {

class FuzzInput {
 public:
  FuzzInput(const std::uint8_t* data, std::size_t size)
      : bytes_(reinterpret_cast<const char*>(data), size) {}

  template <class T>
    requires std::is_integral_v<T>
  T take() {
    T value{};
    const std::size_t count = std::min(sizeof value, bytes_.size());
    std::memcpy(&value, bytes_.data(), count);
    bytes_.remove_prefix(count);
    return value;
  }

  // A string of at most `most` bytes, its length given by the next byte.
  std::string take_string(std::size_t most) {
    const std::size_t length = std::min<std::size_t>({take<std::uint8_t>(), most, bytes_.size()});
    std::string text(bytes_.substr(0, length));
    bytes_.remove_prefix(length);
    return text;
  }

  // Everything not taken yet.
  std::string_view rest() const { return bytes_; }

 private:
  std::string_view bytes_;
};

}  // namespace cohort::fuzz
