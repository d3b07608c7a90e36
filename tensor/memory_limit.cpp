// tensor/memory_limit.cpp — sizes in bytes, allocation labels, the out-of-memory explainer and
// the error's message (Note [Device memory cap] in memory_limit.h; the cap itself is enforced
// where the bytes are counted, storage.cpp, and in the CUDA caching allocator).

#include "tensor/memory_limit.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <utility>

#include "tensor/error.h"

namespace loom {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

struct Unit {
  const char* name;  // lower case
  int64_t scale;
};
constexpr Unit kUnits[] = {
    {"", 1},
    {"b", 1},
    {"kib", 1LL << 10},
    {"mib", 1LL << 20},
    {"gib", 1LL << 30},
    {"tib", 1LL << 40},
    {"k", 1LL << 10},
    {"m", 1LL << 20},
    {"g", 1LL << 30},
    {"t", 1LL << 40},
    {"kb", 1000LL},
    {"mb", 1000000LL},
    {"gb", 1000000000LL},
    {"tb", 1000000000000LL},
};

}  // namespace

int64_t parse_memory_size(std::string_view text, std::string_view what) {
  const auto bad = [&](std::string_view why) {
    return ValueError(detail::str(
        what, "='", text, "': ", why,
        "; write bytes, or a number and a unit: 2GiB, 512MiB, 1.5GB (KiB, MiB, GiB, TiB are "
        "powers of 1024; kB, MB, GB, TB of 1000)"));
  };
  const std::string_view s = trim(text);
  if (!s.empty() && s.front() == '-') throw bad("a size cannot be negative");
  // The number: digits, then optionally a point and more digits (exact: the fraction is
  // kept as numerator / 10^digits, at most 18 digits of it).
  size_t end = 0;
  int64_t whole = 0;
  bool overflow = false;
  while (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end]))) {
    overflow = overflow || __builtin_mul_overflow(whole, 10, &whole) ||
               __builtin_add_overflow(whole, s[end] - '0', &whole);
    ++end;
  }
  size_t digits = end;
  unsigned __int128 numerator = 0, denominator = 1;
  if (end < s.size() && s[end] == '.') {
    for (++end; end < s.size() && std::isdigit(static_cast<unsigned char>(s[end])); ++end) {
      ++digits;
      if (denominator >= 1000000000000000000ULL) continue;
      numerator = numerator * 10 + static_cast<unsigned>(s[end] - '0');
      denominator *= 10;
    }
  }
  if (digits == 0) throw bad("expected a number");
  std::string unit(trim(s.substr(end)));
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    int64_t bytes = 0;
    const auto part =
        static_cast<int64_t>(numerator * static_cast<uint64_t>(u.scale) / denominator);
    overflow = overflow || __builtin_mul_overflow(whole, u.scale, &bytes) ||
               __builtin_add_overflow(bytes, part, &bytes);
    if (overflow) throw bad("too large");
    return bytes;
  }
  throw bad(detail::str("unknown unit '", trim(s.substr(end)), "'"));
}

int64_t memory_limit_from_environment() {
  const char* value = std::getenv(kMaxMemoryVariable);
  if (value == nullptr || trim(value).empty()) return 0;
  return parse_memory_size(value, kMaxMemoryVariable);
}

std::string format_bytes(int64_t bytes) {
  static const char* const kNames[] = {"KiB", "MiB", "GiB", "TiB"};
  const double magnitude = std::fabs(static_cast<double>(bytes));
  if (magnitude < 1024) return detail::str(bytes, " B");
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (unit < 3 && std::fabs(value) >= 1024) {
    value /= 1024;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.2f %s", value, kNames[unit]);
  return text;
}

// ---------------------------------------------------------------- labels

namespace {

struct Label {
  const char* activity = nullptr;
  const char* name = nullptr;
};
thread_local Label current_label;

}  // namespace

AllocationLabel::AllocationLabel(const char* activity, const char* name) noexcept
    : previous_activity_(current_label.activity), previous_name_(current_label.name) {
  current_label = {activity, name};
}

AllocationLabel::~AllocationLabel() { current_label = {previous_activity_, previous_name_}; }

std::string AllocationLabel::current() {
  if (current_label.activity == nullptr) return "";
  return std::string(current_label.activity) + (current_label.name ? current_label.name : "");
}

// ---------------------------------------------------------------- the explainer

namespace {

struct ExplainerSlot {
  std::mutex mutex;
  OutOfMemoryExplainer explainer;
};
ExplainerSlot& explainer_slot() {
  static ExplainerSlot* slot = new ExplainerSlot();  // never destroyed, as the accounting
  return *slot;
}
thread_local bool explaining = false;  // an allocation of the explainer's own: no recursion

// The registered explainer's text for `device`, "" without one.
std::string explanation(Device device) {
  OutOfMemoryExplainer explainer;
  {
    ExplainerSlot& slot = explainer_slot();
    std::lock_guard<std::mutex> lock(slot.mutex);
    explainer = slot.explainer;
  }
  if (!explainer || explaining) return "";
  explaining = true;
  std::string text;
  try {
    text = explainer(device);
  } catch (const std::exception& e) {
    text = detail::str("(the out-of-memory explainer failed: ", e.what(), ")");
  }
  explaining = false;
  return text;
}

}  // namespace

OutOfMemoryExplainer set_out_of_memory_explainer(OutOfMemoryExplainer explainer) {
  ExplainerSlot& slot = explainer_slot();
  std::lock_guard<std::mutex> lock(slot.mutex);
  return std::exchange(slot.explainer, std::move(explainer));
}

namespace detail {

std::string out_of_memory_message(const OutOfMemoryFacts& f) {
  std::ostringstream os;
  os << "out of memory on " << f.device << ": allocating " << format_bytes(f.requested) << " ("
     << f.requested << " bytes";
  if (f.dtype) {
    os << ", " << *f.dtype << " ";
    append(os, f.shape);
  }
  os << ")";
  const std::string label = AllocationLabel::current();
  if (!label.empty()) os << " " << label;
  if (!f.allocator_reason.empty()) {
    os << ": " << f.allocator_reason;
  } else if (f.cap > 0) {
    os << " would take loom's tensors on " << f.device << " to "
       << format_bytes(f.held + f.requested) << ", over the cap of " << format_bytes(f.cap) << " ("
       << f.cap_source << ")";
  } else {
    os << ": the system has no more memory to give";
  }
  os << "; they hold " << format_bytes(f.held) << " (" << f.held << " bytes; peak "
     << format_bytes(f.peak) << "). Nothing was allocated.";
  const std::string more = explanation(f.device);
  if (!more.empty()) os << "\n" << more;
  return os.str();
}

}  // namespace detail
}  // namespace loom
