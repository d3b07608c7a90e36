// dist/collective_checks.h — the fingerprint protocol of Note [Collective checks], one component
// that both process groups use: gloo checks each collective before it runs, nccl publishes from
// its watchdog and compares only when a collective stalls (Note [NCCL streams and waits]).
//
// Note [Collective checks]
// Each collective gets a sequence number (1, 2, ... per process group). A rank publishes its
// fingerprint of the call, the op with the dtype and shape of its tensor and its arguments
// ("allreduce(float32 [2, 3], sum)"), under "coll/<seq>/<rank>" in the group's store. Ranks
// whose fingerprints differ called different collectives, or the same one on different tensors:
// they raise DistError naming both fingerprints instead of hanging or reducing the wrong bytes.
// A collective that does not finish within the timeout raises DistError naming the op, its
// sequence number and the ranks whose fingerprint never appeared (they never arrived).
//   gloo: before running collective seq, a rank publishes its fingerprint and reads one peer's:
//     rank 0 the last rank's, every other rank rank 0's, so that with two ranks both sides of
//     a mismatch see it at once. A rank that fails closes its connections, so peers already
//     inside the collective fail too and read the store to say why; a rank that finds peers
//     missing writes a tombstone ("(never arrived) ...") in their place, so that ranks blocked
//     on those fingerprints learn it at once instead of at their own timeout (a late rank that
//     does arrive overwrites it).
//   nccl: the host never waits for the store on the collectives' path: the watchdog publishes
//     the fingerprints, and compares them when a collective has stalled or timed out.
// A rank's keys are deleted once a later collective in which every rank's data reaches every
// rank (all but broadcast) has completed here: every rank has then passed the earlier checks.
// The checks cost a store round trip per collective on the gloo path; they are on by default,
// and LOOM_CHECK_COLLECTIVES=0 turns them off (docs/benchmarks.md measures what they cost).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/store.h"
#include "tensor/tensor.h"

namespace loom::dist {

// What a collective's fingerprint and description say of a tensor: "float32 [2, 3]".
std::string describe_tensor(const Tensor& t);

// Whether the checks are on by default: LOOM_CHECK_COLLECTIVES=0 turns them off, else on.
bool check_collectives_from_environment();

// One process group's fingerprints in its store (keys "coll/<seq>/<rank>").
class CollectiveChecks {
 public:
  CollectiveChecks(std::shared_ptr<Store> store, int rank, int size, Milliseconds timeout);

  // What the store says of collective `seq`: read without waiting, peer by peer.
  struct Arrivals {
    int mismatched_rank = -1;   // the first peer that published another fingerprint, or -1
    std::string theirs;         // that peer's fingerprint
    std::vector<int> missing;   // peers whose fingerprint is absent or a tombstone
    std::string store_failure;  // non-empty when the store does not answer
  };
  Arrivals arrivals(int64_t seq, const std::string& fingerprint);

  void publish(int64_t seq, const std::string& fingerprint);
  // The gloo check: publishes `fingerprint`, waits up to `wait` for the one peer's and raises
  // DistError "<description>: ..." on a mismatch or a tombstone; a peer that does not publish
  // in time raises diagnose()'s message.
  void check(int64_t seq, const std::string& fingerprint, const std::string& description,
             Milliseconds wait);
  // Why collective `seq` failed (gloo): "<description> timed out after 500 ms; ranks that never
  // arrived: 2", a mismatch, or "every rank arrived, so one failed or stalled inside it", with
  // the transport's `cause` where it adds something. Writes a tombstone for each missing rank.
  std::string diagnose(int64_t seq, const std::string& fingerprint, const std::string& description,
                       bool timed_out, const std::string& cause);
  // The same facts as a suffix for nccl's messages: "; ranks that never arrived: 1", ": the ranks
  // called different collectives: ...", "; the store does not answer either (...)".
  std::string arrivals_suffix(int64_t seq, const std::string& fingerprint);
  // ": the ranks called different collectives: ..." when a peer published another fingerprint,
  // else "" (peers that have not published yet may still arrive).
  std::string find_mismatch(int64_t seq, const std::string& fingerprint);
  // Deletes this rank's fingerprint of `seq`; false when the store does not answer.
  bool forget(int64_t seq);

 private:
  std::string key(int64_t seq, int rank) const;
  std::string mismatch(const std::string& fingerprint, int peer, const std::string& theirs) const;
  // `found` as the suffix arrivals_suffix returns.
  std::string summary(const Arrivals& found, const std::string& fingerprint) const;

  std::shared_ptr<Store> store_;
  int rank_, size_;
  Milliseconds timeout_;  // the group's, for the messages
};

}  // namespace loom::dist
