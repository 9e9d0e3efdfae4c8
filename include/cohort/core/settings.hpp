// Job settings: what every process of one job must agree on before its first step, and the
// exchange that finds a difference and names it (Trainer::fit runs it; trainer/job_settings.hpp
// lists the fields).
//
//   settings::Fields mine = {{"seed", "11"}, {"micro_batches", "8"}, ...};
//   settings::require_same(mine, "worker 1 (replica 2)", replica_index, max_all_reduce);
//
// Every participant (a replica: every replica of every process) calls require_same with fields of
// the same names in the same order. The happy path is one all-reduce (kMax) of two doubles per
// field: a 52-bit digest of each value and its negation, so that every participant learns the
// largest and the smallest digest of each field. Where they differ, two more all-reduces bring
// the values themselves: the lowest-indexed participant holding the largest digest and the one
// holding the smallest write their value and their name into slots of their own. Every
// participant then throws the same ConfigError, naming the field and both values with who holds
// them. A field whose value is a list of "name=value" words (the optimizer's options) names the
// first word that differs.
//
// max_all_reduce(std::span<double>) must leave in every participant's buffer the elementwise
// maximum over all participants (a communicator's all_reduce with ReduceOp::kMax).
//
// Where there is no collective over every participant (a parameter server and its workers), the
// fields travel as a message instead (encode, decode) to a participant that holds a Reference and
// compares every other one's with it, one at a time, throwing the same sentence.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/core/compilation.hpp"
#include "cohort/core/error.hpp"

namespace cohort::settings {

struct Field {
  std::string name;
  std::string value;
};
using Fields = std::vector<Field>;

// Characters of a value, and of a participant's name, that travel when a field differs.
inline constexpr std::size_t kValueChars = 192;
inline constexpr std::size_t kWhoChars = 64;

// 52 bits of the FNV-1a hash of text: an integer that a double holds exactly.
inline double digest(std::string_view text) {
  std::uint64_t hash = 0xcbf2'9ce4'8422'2325u;
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x0000'0100'0000'01b3u;
  }
  return static_cast<double>(hash >> 12);
}

namespace detail {

// text into slots, one character per double (exact), truncated, zero-padded.
inline void put(std::span<double> slots, std::string_view text) {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    slots[i] = i < text.size() ? static_cast<double>(static_cast<unsigned char>(text[i])) : 0.0;
  }
}

inline std::string get(std::span<const double> slots) {
  std::string text;
  for (const double slot : slots) {
    if (slot == 0.0) break;
    text.push_back(static_cast<char>(static_cast<unsigned char>(slot)));
  }
  return text;
}

// The sentence every participant throws: `field` is `left` on `left_who` but `right` on
// `right_who`.
[[gnu::cold]] COHORT_DECL std::string refusal(const std::string& field, const std::string& left,
                                              std::string_view left_who, const std::string& right,
                                              std::string_view right_who);
}  // namespace detail

// Throws ConfigError on every participant when some field differs between participants; returns
// when all agree. `index` identifies this participant (distinct for each: a global replica
// index); `who` names it in the message ("worker 1 (replica 2)").
template <class MaxAllReduce>
[[gnu::cold]] void require_same(const Fields& mine, std::string_view who, std::size_t index,
                                MaxAllReduce&& max_all_reduce) {
  std::vector<double> digests(2 * mine.size());
  for (std::size_t f = 0; f < mine.size(); ++f) {
    digests[2 * f] = digest(mine[f].value);
    digests[2 * f + 1] = -digests[2 * f];
  }
  const std::vector<double> own = digests;
  max_all_reduce(std::span<double>(digests));
  std::size_t field = 0;
  while (field < mine.size() && digests[2 * field] == -digests[2 * field + 1]) ++field;
  if (field == mine.size()) return;

  // Who writes each of the two values: the lowest index holding the largest digest, and the
  // lowest holding the smallest.
  const double largest = digests[2 * field];
  const double smallest = -digests[2 * field + 1];
  const double none = std::numeric_limits<double>::lowest();
  const double me = -static_cast<double>(index);
  std::vector<double> writers = {own[2 * field] == largest ? me : none,
                                 own[2 * field] == smallest ? me : none};
  max_all_reduce(std::span<double>(writers));

  constexpr std::size_t kSlot = kValueChars + kWhoChars;
  std::vector<double> texts(2 * kSlot, 0.0);
  for (std::size_t side = 0; side < 2; ++side) {
    if (writers[side] != me) continue;
    const std::span<double> slot = std::span<double>(texts).subspan(side * kSlot, kSlot);
    detail::put(slot.first(kValueChars), mine[field].value);
    detail::put(slot.subspan(kValueChars), who);
  }
  max_all_reduce(std::span<double>(texts));
  const auto text = [&](std::size_t side, std::size_t offset, std::size_t count) {
    return detail::get(std::span<const double>(texts).subspan(side * kSlot + offset, count));
  };
  // The lower-indexed participant first.
  const std::size_t first = -writers[0] <= -writers[1] ? 0 : 1;
  const std::size_t second = 1 - first;
  throw ConfigError(detail::refusal(
      mine[field].name, text(first, 0, kValueChars), text(first, kValueChars, kWhoChars),
      text(second, 0, kValueChars), text(second, kValueChars, kWhoChars)));
}

// --- as a message -------------------------------------------------------------------------------

// The longest encoding a participant accepts (decode): far more than any job's fields take.
inline constexpr std::size_t kMaxEncodedBytes = std::size_t{16} << 10;

// Fields as bytes: each name and each value (cut to kValueChars, as they travel in require_same)
// followed by a zero byte.
COHORT_DECL std::vector<std::byte> encode(const Fields& fields);
// The fields of encode's bytes; nothing when they are not such a list.
COHORT_DECL std::optional<Fields> decode(std::span<const std::byte> bytes);
// What one participant compares every other one's fields with, one at a time: its own fields,
// named after itself, and for every other field the value of the first participant compared
// (a parameter server holds the optimizer's settings itself and takes the seed from the chief,
// whose settings it compares first).
class Reference {
 public:
  Reference() = default;
  COHORT_DECL Reference(const Fields& own, std::string_view holder);
  // "" when `theirs`, the fields of `who`, agree with the reference; otherwise the sentence that
  // names the first field of the reference that differs (or that `theirs` lacks), both values and
  // who holds each. Fields the reference lacks join it, held by `who`.
  [[gnu::cold]] COHORT_DECL std::string compare(const Fields& theirs, std::string_view who);

 private:
  struct Held {
    Field field;
    std::string holder;
  };
  std::vector<Held> held_;
};

}  // namespace cohort::settings

#if !defined(COHORT_SEPARATE_COMPILATION)
#include "cohort/core/impl/settings.ipp"
#endif
