// dist/shm_collectives.cpp — Note [Shared-memory allreduce]: the segment's layout, the handshake
// that maps it on every rank, the rounds of the allreduce and the waits between them.
#include "dist/shm_collectives.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>

#include "dist/reductions.h"
#include "tensor/dispatch.h"
#include "tensor/error.h"

namespace loom::dist {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x316d68736d6f6f6cULL;  // "loomshm1"
// A round's bytes per rank: 1 MiB keeps a round's slots in the caches the ranks share, and a
// 10 MiB gradient bucket still takes only about ten rounds (docs/cpu_speed.md measured 256 KiB
// to 4 MiB).
constexpr int64_t kChunkBytes = int64_t{1} << 20;
// Pieces are cut at cache lines, so that two ranks never write one line.
constexpr int64_t kLineBytes = 64;
// How many times a waiting rank reads the flag before it sleeps on the futex, and how long each
// sleep lasts before it looks at the deadline, the abort flag and its peers' pids again.
constexpr int kSpins = 200;
constexpr Milliseconds kSleepSlice(20);
constexpr Milliseconds kLivenessPeriod(50);

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// Per rank: its flags and the collective it is in. One cache line each.
struct alignas(64) RankFlags {
  uint32_t copied;    // the last round whose pieces this rank has copied into its slot
  uint32_t reduced;   // the last round whose own piece it has reduced
  uint32_t sleepers;  // ranks asleep on this rank's flags: it wakes them only if there are some
  int32_t pid;
  // The collective of its current round: its kind (a Kind), element count (bytes for the kinds
  // without a dtype), dtype (-1 without) and op or root.
  int32_t kind;
  int32_t dtype;
  int64_t count;
  int32_t op;
};

enum Kind : int32_t { kAllreduce = 1, kBroadcast, kAllgather, kReduceScatter };

}  // namespace

struct ShmCollectives::Header {
  uint64_t magic;
  uint64_t token;  // rank 0's random number: a rank that reads it maps the same segment
  int32_t size;
  int32_t pad;
  int64_t chunk_bytes;
  uint32_t aborted_by;  // rank + 1 of the first rank that aborted, 0 while none has
  uint32_t reason_ready;
  char reason[512];
};

namespace {

using Header = ShmCollectives::Header;

int64_t flags_offset() { return round_up(sizeof(Header), kLineBytes); }
int64_t slots_offset(int size) {
  return round_up(flags_offset() + size * static_cast<int64_t>(sizeof(RankFlags)), 4096);
}
int64_t segment_size(int size) { return slots_offset(size) + 2 * size * kChunkBytes; }

Header& header_of(void* base) { return *static_cast<Header*>(base); }
RankFlags& flags_of(void* base, int rank) {
  return reinterpret_cast<RankFlags*>(static_cast<char*>(base) + flags_offset())[rank];
}

uint32_t load(uint32_t& word) { return std::atomic_ref<uint32_t>(word).load(); }
void store(uint32_t& word, uint32_t value) { std::atomic_ref<uint32_t>(word).store(value); }

// Round numbers wrap around after 2^32 rounds; `have` has reached `want` when it is at most
// 2^31 ahead.
bool reached(uint32_t have, uint32_t want) { return static_cast<int32_t>(have - want) >= 0; }

void futex_wait(uint32_t& word, uint32_t seen, Milliseconds slice) {
  const timespec relative{0, static_cast<long>(slice.count()) * 1000000L};
  ::syscall(SYS_futex, &word, FUTEX_WAIT, seen, &relative, nullptr, 0);  // not private: shared
}
void futex_wake_all(uint32_t& word) {
  ::syscall(SYS_futex, &word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void pause_briefly() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The namespaces whose sharing makes ranks "one host" here (the Note's Which groups).
std::string namespaces() {
  std::string out;
  for (const char* ns : {"/proc/self/ns/net", "/proc/self/ns/pid"}) {
    char link[128] = {};
    const ssize_t n = ::readlink(ns, link, sizeof(link) - 1);
    if (!out.empty()) out += ", ";
    out += n > 0 ? std::string(link, static_cast<size_t>(n)) : std::string("?");
  }
  return out;
}

// True when `pid` has exited: gone, or a zombie its parent has not reaped yet (kill succeeds on
// those, so /proc says it).
bool has_exited(int32_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::FILE* stat = std::fopen(detail::str("/proc/", pid, "/stat").c_str(), "r");
  if (stat == nullptr) return false;
  char line[512] = {};
  const size_t n = std::fread(line, 1, sizeof(line) - 1, stat);
  std::fclose(stat);
  const char* name_end = std::strrchr(line, ')');  // the command name may hold spaces
  return n > 0 && name_end != nullptr && name_end[1] == ' ' &&
         (name_end[2] == 'Z' || name_end[2] == 'X');
}

std::string errno_text(const char* call) { return detail::str(call, ": ", std::strerror(errno)); }

// Makes and maps the segment (rank 0); the reason on failure. posix_fallocate reserves the
// pages now: a /dev/shm too small (a container's 64 MiB default) fails here, not with SIGBUS
// in the middle of a collective.
void* create_segment(const std::string& name, int64_t bytes, std::string& failure) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    failure = errno_text("shm_open");
    return nullptr;
  }
  const int rc = ::posix_fallocate(fd, 0, bytes);
  void* base = rc == 0 ? ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                                MAP_SHARED, fd, 0)
                       : MAP_FAILED;
  if (rc != 0) failure = detail::str("posix_fallocate of ", bytes, " bytes: ", std::strerror(rc));
  if (rc == 0 && base == MAP_FAILED) failure = errno_text("mmap");
  ::close(fd);
  if (base == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return nullptr;
  }
  return base;
}

void* open_segment(const std::string& name, int64_t bytes, std::string& failure) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    const int err = errno;
    failure = detail::str(err == ENOENT ? "rank 0's segment is not in this /dev/shm (another "
                                          "host, or a container with its own /dev/shm): "
                                        : "",
                          "shm_open: ", std::strerror(err));
    return nullptr;
  }
  struct stat st {};
  void* base = MAP_FAILED;
  if (::fstat(fd, &st) != 0) {
    failure = errno_text("fstat");
  } else if (st.st_size != bytes) {
    failure = detail::str("the segment holds ", st.st_size, " bytes, not ", bytes);
  } else {
    base = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) failure = errno_text("mmap");
  }
  ::close(fd);
  return base == MAP_FAILED ? nullptr : base;
}

Bytes to_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

}  // namespace

bool shared_memory_from_environment() {
  const char* value = std::getenv("LOOM_SHARED_MEMORY");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// ---------------------------------------------------------------- the handshake

std::unique_ptr<ShmCollectives> ShmCollectives::connect(Store& store, int rank, int size,
                                                        Milliseconds timeout,
                                                        std::string& why_not) {
  LOOM_ASSERT(size > 1, "ShmCollectives::connect: a group of one rank has nothing to share");
  const int64_t bytes = segment_size(size);
  const std::string identity = namespaces();
  std::string name, failure;
  void* base = nullptr;
  if (rank == 0) {
    std::random_device entropy;
    const uint64_t token = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
    name = detail::str("/loom-", ::getpid(), "-", token);
    base = create_segment(name, bytes, failure);
    if (base != nullptr) {
      Header& h = header_of(base);  // the rest is zero, as posix_fallocate left it
      h.token = token;
      h.size = size;
      h.chunk_bytes = kChunkBytes;
      h.magic = kMagic;
    }
    store.set("shm/segment",
              to_bytes(base != nullptr ? detail::str(name, "\n", token, "\n", identity) : ""));
  } else {
    const std::string published = to_string(store.get("shm/segment", timeout));
    const size_t first = published.find('\n'), second = published.find('\n', first + 1);
    if (published.empty() || second == std::string::npos) {
      failure = "rank 0 made no segment";
    } else if (published.substr(second + 1) != identity) {
      failure = detail::str("its namespaces (", identity, ") are not rank 0's (",
                            published.substr(second + 1), ")");
    } else {
      name = published.substr(0, first);
      const uint64_t token = std::stoull(published.substr(first + 1, second - first - 1));
      base = open_segment(name, bytes, failure);
      if (base != nullptr) {
        const Header& h = header_of(base);
        if (h.magic != kMagic || h.token != token || h.size != size ||
            h.chunk_bytes != kChunkBytes) {
          failure = "the segment of that name is not rank 0's (another /dev/shm)";
          ::munmap(base, static_cast<size_t>(bytes));
          base = nullptr;
        }
      }
    }
  }
  if (base != nullptr) flags_of(base, rank).pid = static_cast<int32_t>(::getpid());
  store.set("shm/ok/" + std::to_string(rank), to_bytes(base != nullptr ? "ok" : failure));
  why_not.clear();
  for (int q = 0; q < size && why_not.empty(); ++q) {
    const std::string said = to_string(store.get("shm/ok/" + std::to_string(q), timeout));
    if (said != "ok") why_not = detail::str("rank ", q, ": ", said);
  }
  if (rank == 0 && !name.empty()) ::shm_unlink(name.c_str());  // every rank has mapped it
  if (!why_not.empty()) {
    if (base != nullptr) ::munmap(base, static_cast<size_t>(bytes));
    return nullptr;
  }
  return std::unique_ptr<ShmCollectives>(new ShmCollectives(base, bytes, rank, size));
}

ShmCollectives::ShmCollectives(void* base, int64_t bytes, int rank, int size)
    : base_(base), bytes_(bytes), rank_(rank), size_(size) {}

ShmCollectives::~ShmCollectives() { ::munmap(base_, static_cast<size_t>(bytes_)); }

// ---------------------------------------------------------------- failures

void ShmCollectives::abort(const std::string& why) {
  Header& h = header_of(base_);
  uint32_t none = 0;
  if (std::atomic_ref<uint32_t>(h.aborted_by).compare_exchange_strong(none, rank_ + 1)) {
    const size_t n = std::min(why.size(), sizeof(h.reason) - 1);
    std::memcpy(h.reason, why.data(), n);
    h.reason[n] = '\0';
    store(h.reason_ready, 1);
  }
  for (int q = 0; q < size_; ++q) {
    futex_wake_all(flags_of(base_, q).copied);
    futex_wake_all(flags_of(base_, q).reduced);
  }
}

// ---------------------------------------------------------------- waiting

struct ShmCollectives::Wait {
  const char* op_name;  // "allreduce", "broadcast", "allgather", "reduce_scatter"
  Deadline deadline;
  const std::function<std::string()>& failed;
  Clock::time_point began = Clock::now();
  Clock::time_point next_liveness = began + kLivenessPeriod;
};

namespace {

// Why a wait for `peer`'s flag must end now, or "" while it may go on.
std::string why_stop(void* base, int peer, const char* flag, uint32_t round,
                     ShmCollectives::Wait& wait) {
  Header& h = header_of(base);
  if (const uint32_t by = load(h.aborted_by); by != 0) {
    const char* reason = load(h.reason_ready) != 0 ? h.reason : "(no reason yet)";
    return detail::str(wait.op_name, " through shared memory: rank ", by - 1,
                       " gave up on the group: ", reason);
  }
  const auto now = Clock::now();
  if (now >= wait.deadline)
    return detail::str(wait.op_name, " through shared memory timed out after ",
                       std::chrono::duration_cast<Milliseconds>(now - wait.began).count(),
                       " ms waiting for rank ", peer, " (", flag, " round ", round, ")");
  if (now >= wait.next_liveness) {  // every peer: the one awaited may itself wait for a dead one
    wait.next_liveness = now + kLivenessPeriod;
    for (int q = 0; q < h.size; ++q) {
      const int32_t pid = flags_of(base, q).pid;
      if (pid != ::getpid() && has_exited(pid))
        return detail::str(wait.op_name, " through shared memory: rank ", q, " (pid ", pid,
                           ") exited during the collective");
    }
    if (std::string reason = wait.failed(); !reason.empty()) return reason;
  }
  return "";
}

}  // namespace

void ShmCollectives::raise_and_await(bool copied, uint32_t round, Wait& wait) {
  RankFlags& mine = flags_of(base_, rank_);
  uint32_t& raised = copied ? mine.copied : mine.reduced;
  std::atomic_ref<uint32_t>(raised).store(round, std::memory_order_seq_cst);
  if (std::atomic_ref<uint32_t>(mine.sleepers).load(std::memory_order_seq_cst) != 0)
    futex_wake_all(raised);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    RankFlags& theirs = flags_of(base_, q);
    uint32_t& word = copied ? theirs.copied : theirs.reduced;
    bool ready = false;
    for (int spin = 0; spin < kSpins && !(ready = reached(load(word), round)); ++spin)
      pause_briefly();
    while (!ready) {
      const std::string stop = why_stop(base_, q, copied ? "copied" : "reduced", round, wait);
      if (!stop.empty()) throw DistError(stop);
      // Counted before the flag is read again: a rank that raises it after this read sees the
      // sleeper and wakes it (both sides sequentially consistent).
      std::atomic_ref<uint32_t> sleepers(theirs.sleepers);
      sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = std::atomic_ref<uint32_t>(word).load(std::memory_order_seq_cst);
      if (!(ready = reached(seen, round))) futex_wait(word, seen, kSleepSlice);
      sleepers.fetch_sub(1, std::memory_order_seq_cst);
      ready = ready || reached(load(word), round);
    }
  }
}

// ---------------------------------------------------------------- the collectives

void ShmCollectives::check_alike(const Wait& wait) {
  const RankFlags& mine = flags_of(base_, rank_);
  auto what = [&](const RankFlags& f) -> std::string {
    auto values = [&] {
      return detail::str(f.count, " ", static_cast<DType>(f.dtype), " values (",
                         to_string(static_cast<ReduceOp>(f.op)), ")");
    };
    switch (f.kind) {
      case kAllreduce:
        return "an allreduce of " + values();
      case kBroadcast:
        return detail::str("a broadcast of ", f.count, " bytes from rank ", f.op);
      case kAllgather:
        return detail::str("an allgather of ", f.count, " bytes a rank");
      case kReduceScatter:
        return "a reduce-scatter of " + values() + " a rank";
    }
    return detail::str("a collective of kind ", f.kind);
  };
  for (int q = 0; q < size_; ++q) {
    const RankFlags& theirs = flags_of(base_, q);
    LOOM_CHECK(theirs.kind == mine.kind && theirs.count == mine.count &&
                   theirs.dtype == mine.dtype && theirs.op == mine.op,
               DistError, wait.op_name, " through shared memory: rank ", rank_, " runs ",
               what(mine), ", rank ", q, " ", what(theirs));
  }
}

template <typename Fill, typename Read, typename After>
void ShmCollectives::run_round(Wait& wait, const Descriptor* first, Fill&& fill, Read&& read,
                               After&& after) {
  const uint32_t round = ++round_;
  char* buffer =
      static_cast<char*>(base_) + slots_offset(size_) + (round & 1) * size_ * kChunkBytes;
  fill(buffer);
  if (first != nullptr) {
    RankFlags& mine = flags_of(base_, rank_);
    mine.kind = first->kind;
    mine.count = first->count;
    mine.dtype = first->dtype;
    mine.op = first->op;
  }
  raise_and_await(/*copied=*/true, round, wait);
  if (first != nullptr) check_alike(wait);
  read(buffer);
  raise_and_await(/*copied=*/false, round, wait);
  after(buffer);
}

namespace {

void nothing(char*) {}

}  // namespace

void ShmCollectives::allreduce(void* data, int64_t n, DType dtype, ReduceOp op, Deadline deadline,
                               const std::function<std::string()>& failed) {
  if (n == 0) return;
  Wait wait{"allreduce", deadline, failed};
  const Descriptor descriptor{kAllreduce, n, static_cast<int32_t>(dtype), static_cast<int32_t>(op)};
  reduction::dispatch_reducible(dtype, wait.op_name, [&]<typename T>() {
    const int64_t chunk = kChunkBytes / static_cast<int64_t>(sizeof(T));
    const int64_t line = std::max<int64_t>(1, kLineBytes / static_cast<int64_t>(sizeof(T)));
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const int64_t m = std::min(chunk, n - begin);
      // Piece p of the round is [cut(p), cut(p + 1)): rank p's to reduce.
      auto cut = [&](int p) { return p == size_ ? m : m * p / size_ / line * line; };
      auto piece_bytes = [&](int p) { return (cut(p + 1) - cut(p)) * sizeof(T); };
      auto slot = [&](char* buffer, int q) {
        return reinterpret_cast<T*>(buffer + q * kChunkBytes);
      };
      T* here = static_cast<T*>(data) + begin;
      run_round(
          wait, begin == 0 ? &descriptor : nullptr,
          [&](char* buffer) {  // the pieces the other ranks reduce, into this rank's slot
            for (int p = 0; p < size_; ++p)
              if (p != rank_)
                std::memcpy(slot(buffer, rank_) + cut(p), here + cut(p), piece_bytes(p));
          },
          [&](char* buffer) {  // this rank's piece, folded in rank order, into its slot and tensor
            const int64_t lo = cut(rank_), len = cut(rank_ + 1) - lo;
            if (len == 0) return;
            auto piece_of = [&](int q) -> const T* {
              return (q == rank_ ? here : slot(buffer, q)) + lo;
            };
            T* sum = slot(buffer, rank_) + lo;
            reduction::reduce_into(sum, piece_of(0), piece_of(1), len, op);
            for (int q = 2; q < size_; ++q) reduction::reduce_into(sum, sum, piece_of(q), len, op);
            if (op == ReduceOp::Avg) reduction::divide(sum, len, size_);
            std::memcpy(here + lo, sum, len * sizeof(T));
          },
          [&](char* buffer) {  // the other ranks' reduced pieces, from their slots
            for (int p = 0; p < size_; ++p)
              if (p != rank_) std::memcpy(here + cut(p), slot(buffer, p) + cut(p), piece_bytes(p));
          });
    }
  });
}

// The root copies a chunk into its slot; the others copy it out.
void ShmCollectives::broadcast(void* data, int64_t bytes, int root, Deadline deadline,
                               const std::function<std::string()>& failed) {
  if (bytes == 0) return;
  Wait wait{"broadcast", deadline, failed};
  const Descriptor descriptor{kBroadcast, bytes, -1, root};
  char* x = static_cast<char*>(data);
  for (int64_t begin = 0; begin < bytes; begin += kChunkBytes) {
    const int64_t m = std::min(kChunkBytes, bytes - begin);
    run_round(
        wait, begin == 0 ? &descriptor : nullptr,
        [&](char* buffer) {
          if (rank_ == root) std::memcpy(buffer + root * kChunkBytes, x + begin, m);
        },
        [&](char* buffer) {
          if (rank_ != root) std::memcpy(x + begin, buffer + root * kChunkBytes, m);
        },
        nothing);
  }
}

// Each rank copies a chunk of its input into its slot, then the others' chunks out of theirs.
void ShmCollectives::allgather(const void* input, const std::vector<void*>& out, int64_t bytes,
                               Deadline deadline, const std::function<std::string()>& failed) {
  LOOM_ASSERT(static_cast<int>(out.size()) == size_, "ShmCollectives::allgather: ", out.size(),
              " outputs for ", size_, " ranks");
  if (bytes == 0) return;
  Wait wait{"allgather", deadline, failed};
  const Descriptor descriptor{kAllgather, bytes, -1, 0};
  const char* x = static_cast<const char*>(input);
  for (int64_t begin = 0; begin < bytes; begin += kChunkBytes) {
    const int64_t m = std::min(kChunkBytes, bytes - begin);
    run_round(
        wait, begin == 0 ? &descriptor : nullptr,
        [&](char* buffer) { std::memcpy(buffer + rank_ * kChunkBytes, x + begin, m); },
        [&](char* buffer) {
          for (int q = 0; q < size_; ++q) {
            char* to = static_cast<char*>(out[q]) + begin;
            if (q != rank_) {
              std::memcpy(to, buffer + q * kChunkBytes, m);
            } else if (to != x + begin) {  // in place when the input is this rank's output
              std::memmove(to, x + begin, m);
            }
          }
        },
        nothing);
  }
}

// A round covers a chunk of every piece: a rank copies its inputs' chunks for the other ranks
// into its slot (piece p at p chunks in), then folds chunk `rank` of every rank's piece, in
// rank order and its own from its input, in the unused part of its slot, and copies it out:
// out may be this rank's input piece (DDP's ZeRO buckets reduce in place), which a third
// rank's term must not find overwritten.
void ShmCollectives::reduce_scatter(void* out, const std::vector<const void*>& inputs, int64_t n,
                                    DType dtype, ReduceOp op, Deadline deadline,
                                    const std::function<std::string()>& failed) {
  LOOM_ASSERT(static_cast<int>(inputs.size()) == size_,
              "ShmCollectives::reduce_scatter: ", inputs.size(), " inputs for ", size_, " ranks");
  if (n == 0) return;
  Wait wait{"reduce_scatter", deadline, failed};
  const Descriptor descriptor{kReduceScatter, n, static_cast<int32_t>(dtype),
                              static_cast<int32_t>(op)};
  reduction::dispatch_reducible(dtype, wait.op_name, [&]<typename T>() {
    const int64_t line = std::max<int64_t>(1, kLineBytes / static_cast<int64_t>(sizeof(T)));
    const int64_t chunk = kChunkBytes / static_cast<int64_t>(sizeof(T)) / size_ / line * line;
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const int64_t m = std::min(chunk, n - begin);
      auto slot = [&](char* buffer, int q) {
        return reinterpret_cast<T*>(buffer + q * kChunkBytes);
      };
      auto input = [&](int p) { return static_cast<const T*>(inputs[p]) + begin; };
      run_round(
          wait, begin == 0 ? &descriptor : nullptr,
          [&](char* buffer) {
            for (int p = 0; p < size_; ++p)
              if (p != rank_) std::memcpy(slot(buffer, rank_) + p * chunk, input(p), m * sizeof(T));
          },
          [&](char* buffer) {
            auto piece_of = [&](int q) -> const T* {
              return q == rank_ ? input(rank_) : slot(buffer, q) + rank_ * chunk;
            };
            T* sum = slot(buffer, rank_) + rank_ * chunk;
            reduction::reduce_into(sum, piece_of(0), piece_of(1), m, op);
            for (int q = 2; q < size_; ++q) reduction::reduce_into(sum, sum, piece_of(q), m, op);
            if (op == ReduceOp::Avg) reduction::divide(sum, m, size_);
            std::memcpy(static_cast<T*>(out) + begin, sum, m * sizeof(T));
          },
          nothing);
    }
  });
}

}  // namespace loom::dist
