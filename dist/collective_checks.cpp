// dist/collective_checks.cpp — Note [Collective checks]: fingerprints in the store, the
// comparison with a peer's, and the diagnosis of a collective that failed or never finished.

#include "dist/collective_checks.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "tensor/error.h"

namespace loom::dist {

namespace {

Bytes to_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string to_text(const Bytes& b) { return std::string(b.begin(), b.end()); }

// Written in place of a rank that never published its fingerprint (see the Note).
constexpr std::string_view kTombstone = "(never arrived) ";
bool is_tombstone(const std::string& value) { return value.starts_with(kTombstone); }

// "ranks that never arrived: 1, 2".
std::string never_arrived(const std::vector<int>& missing) {
  std::string text = "ranks that never arrived: ";
  for (size_t i = 0; i < missing.size(); ++i) text += (i ? ", " : "") + std::to_string(missing[i]);
  return text;
}

}  // namespace

std::string describe_tensor(const Tensor& t) { return detail::str(t.dtype(), " ", t.sizes()); }

bool check_collectives_from_environment() {
  const char* value = std::getenv("LOOM_CHECK_COLLECTIVES");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

CollectiveChecks::CollectiveChecks(std::shared_ptr<Store> store, int rank, int size,
                                   Milliseconds timeout)
    : store_(std::move(store)), rank_(rank), size_(size), timeout_(timeout) {}

std::string CollectiveChecks::key(int64_t seq, int rank) const {
  return "coll/" + std::to_string(seq) + "/" + std::to_string(rank);
}

std::string CollectiveChecks::mismatch(const std::string& fingerprint, int peer,
                                       const std::string& theirs) const {
  return detail::str("the ranks called different collectives: this rank (", rank_, ") called ",
                     fingerprint, ", rank ", peer, " called ", theirs);
}

void CollectiveChecks::publish(int64_t seq, const std::string& fingerprint) {
  store_->set(key(seq, rank_), to_bytes(fingerprint));
}

void CollectiveChecks::check(int64_t seq, const std::string& fingerprint,
                             const std::string& description, Milliseconds wait) {
  try {
    publish(seq, fingerprint);
  } catch (const DistError& e) {
    throw DistError(description + ": could not publish its fingerprint: " + e.what());
  }
  const int peer = rank_ == 0 ? size_ - 1 : 0;
  std::string theirs;
  try {
    theirs = to_text(store_->get(key(seq, peer), wait));
  } catch (const DistError& e) {
    throw DistError(diagnose(seq, fingerprint, description, /*timed_out=*/true, e.what()));
  }
  if (is_tombstone(theirs)) {
    throw DistError(description + " failed; " + theirs.substr(kTombstone.size()));
  }
  if (theirs != fingerprint)
    throw DistError(description + ": " + mismatch(fingerprint, peer, theirs));
}

CollectiveChecks::Arrivals CollectiveChecks::arrivals(int64_t seq, const std::string& fingerprint) {
  Arrivals found;
  try {
    store_->num_keys();
  } catch (const DistError& e) {
    found.store_failure = e.what();
    return found;
  }
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    try {
      const std::string theirs = to_text(store_->get(key(seq, r), Milliseconds(0)));
      if (is_tombstone(theirs)) {
        found.missing.push_back(r);
      } else if (theirs != fingerprint) {
        found.mismatched_rank = r;
        found.theirs = theirs;
        return found;
      }
    } catch (const DistError&) {
      found.missing.push_back(r);
    }
  }
  return found;
}

std::string CollectiveChecks::summary(const Arrivals& found, const std::string& fingerprint) const {
  if (!found.store_failure.empty())
    return "; the store does not answer either (" + found.store_failure + ")";
  if (found.mismatched_rank >= 0)
    return ": " + mismatch(fingerprint, found.mismatched_rank, found.theirs);
  if (found.missing.empty()) return "; every rank arrived, so one failed or stalled inside it";
  return "; " + never_arrived(found.missing);
}

std::string CollectiveChecks::diagnose(int64_t seq, const std::string& fingerprint,
                                       const std::string& description, bool timed_out,
                                       const std::string& cause) {
  const Arrivals found = arrivals(seq, fingerprint);
  if (found.mismatched_rank >= 0) return description + summary(found, fingerprint);
  const std::string head =
      description + (timed_out ? detail::str(" timed out after ", timeout_.count(), " ms")
                               : std::string(" failed"));
  if (!found.store_failure.empty()) return head + summary(found, fingerprint) + "; " + cause;
  std::string message = head + summary(found, fingerprint);
  if (!timed_out) message += " (" + cause + ")";
  const Bytes tombstone = to_bytes(detail::str(
      kTombstone, never_arrived(found.missing), " (reported by rank ", rank_,
      timed_out ? detail::str(" after its ", timeout_.count(), " ms timeout") : ": " + cause, ")"));
  for (int r : found.missing) {
    try {
      store_->compare_set(key(seq, r), Bytes{}, tombstone);
    } catch (const DistError&) {
      break;  // the store is going away: the message is all we can do
    }
  }
  return message;
}

std::string CollectiveChecks::arrivals_suffix(int64_t seq, const std::string& fingerprint) {
  return summary(arrivals(seq, fingerprint), fingerprint);
}

std::string CollectiveChecks::find_mismatch(int64_t seq, const std::string& fingerprint) {
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    std::string theirs;
    try {
      theirs = to_text(store_->get(key(seq, r), Milliseconds(0)));
    } catch (const DistError&) {
      continue;
    }
    if (theirs != fingerprint && !is_tombstone(theirs))
      return ": " + mismatch(fingerprint, r, theirs);
  }
  return "";
}

bool CollectiveChecks::forget(int64_t seq) {
  try {
    store_->delete_key(key(seq, rank_));
    return true;
  } catch (const DistError&) {
    return false;
  }
}

}  // namespace loom::dist
