// The definitions of trace.hpp (core/compilation.hpp).
#pragma once

#include "cohort/core/trace.hpp"

#include <fstream>
#include <iterator>

namespace cohort::trace {

COHORT_DECL void Recorder::write(const std::filesystem::path& file) const {
  std::error_code ignored;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ignored);
  std::ofstream out(file, std::ios::trunc);
  if (!out) throw ConfigError("trace: cannot write " + file.string());
  const std::lock_guard lock(mutex_);
  out << detail::kOpening;
  out << R"({"ph":"M","name":"process_name","pid":)" << process_ << R"(,"args":{"name":")"
      << escaped(label_) << "\"}}";
  out << ",\n"
      << R"({"ph":"M","name":"process_sort_index","pid":)" << process_
      << R"(,"args":{"sort_index":)" << process_ << "}}";
  for (const auto& [thread, name] : thread_names_) {
    out << ",\n"
        << R"({"ph":"M","name":"thread_name","pid":)" << process_ << ",\"tid\":" << thread
        << R"(,"args":{"name":")" << escaped(name) << "\"}}";
  }
  for (const Event& event : events_) {
    out << ",\n{\"ph\":\"X\",\"name\":\"" << name(event.phase) << "\",\"cat\":\""
        << category(event.phase) << "\",\"pid\":" << process_ << ",\"tid\":" << event.thread
        << ",\"ts\":" << microseconds(origin_wall_us_, event.start_ns)
        << ",\"dur\":" << microseconds(0, event.duration_ns) << ",\"args\":{";
    const char* separator = "";
    for (const auto& [key, value] :
         {std::pair{"step", event.detail.step}, std::pair{"index", event.detail.index},
          std::pair{"bytes", event.detail.bytes}}) {
      if (value == Detail::kNone) continue;
      out << separator << '"' << key << "\":" << value;
      separator = ",";
    }
    out << "}}";
  }
  out << detail::kClosing;
  if (!out.flush()) throw ConfigError("trace: cannot write " + file.string());
}

COHORT_DECL std::string Recorder::microseconds(std::int64_t base_us, std::int64_t ns) {
  const std::int64_t whole = base_us + ns / 1000;
  const std::int64_t fraction = ns % 1000;
  std::string text = std::to_string(whole) + '.';
  text += static_cast<char>('0' + fraction / 100);
  text += static_cast<char>('0' + fraction / 10 % 10);
  text += static_cast<char>('0' + fraction % 10);
  return text;
}

COHORT_DECL std::string Recorder::escaped(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

COHORT_DECL void merge(const std::vector<std::filesystem::path>& files,
                       const std::filesystem::path& merged) {
  using detail::kClosing;
  using detail::kOpening;
  std::string events;
  for (const std::filesystem::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    const std::string text = in ? std::string(std::istreambuf_iterator<char>(in), {}) : "";
    if (!text.starts_with(kOpening) || !text.ends_with(kClosing) ||
        text.size() < kOpening.size() + kClosing.size()) {
      throw ConfigError("trace: " + file.string() + " is not a timeline cohort wrote");
    }
    if (!events.empty()) events += ",\n";
    events += std::string_view(text).substr(kOpening.size(),
                                            text.size() - kOpening.size() - kClosing.size());
  }
  std::ofstream out(merged, std::ios::trunc);
  out << kOpening << events << kClosing;
  if (!out.flush()) throw ConfigError("trace: cannot write " + merged.string());
}

}  // namespace cohort::trace
