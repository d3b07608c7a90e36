// dist/tcp_store.cpp — TCPStore: the protocol of one server connection (ServerSession: bytes in,
// replies out, no socket), the server (a thread per connection driving a session; get and wait
// block on a condition variable until the key appears or their timeout passes) and the client (a
// small pool of connections, so that one thread blocked in get does not hold up another's set).
//
// Note [Store protocol]
//   Version 2. Integers are little-endian; a string is its length (u32) and its bytes. A
//   connection opens with the handshake of Note [Store security]:
//     client  kMagic kVersion client_nonce                  (u32, u32, 32 bytes)
//     server  kMagic kVersion server_nonce                  (and closes if the versions differ)
//     client  HMAC(secret, server_nonce || client_nonce || "client")
//     server  kOk HMAC(secret, server_nonce || client_nonce || "server")  |  kRefused, closes
//   Then one request at a time: an op (u8) and its fields; the reply is a status (u8: kOk,
//   kTimeout, kError) and its fields.
//     SET key value            -> ok
//     GET key timeout_ms       -> ok value | timeout          (the server waits, not the client)
//     ADD key delta            -> ok new_value | error message
//     COMPARE_SET key exp new  -> ok value_afterwards
//     WAIT n key... timeout_ms -> ok | timeout n key...       (the keys still missing)
//     DELETE key               -> ok existed(u8)
//     NUM_KEYS                 -> ok count
//   A key is at most limits.max_key_bytes long, a value at most max_value_bytes, a wait at most
//   kMaxWaitKeys keys of at most max_value_bytes together: the server checks each length as soon
//   as its 4 bytes arrive, before it allocates anything, and drops the connection when one is
//   over. It also drops a connection (closes it and logs why) that sends bad magic, another
//   version, a wrong proof or an unknown op, that does not finish its handshake within
//   handshake_timeout, or that starts a request and does not finish it within request_timeout.
//   The time between requests is free: clients keep idle connections in their pool.
//   A server that shuts down closes every connection: clients see end-of-file and raise
//   DistError at once (and on every later call: the store's state is gone with the server).
//
// Note [Store security]
//   Who can use a job's store, and what a stranger who reaches its port can do.
//   1. Where the server listens: the address the job names (MASTER_ADDR=127.0.0.1: this machine
//      only; a name or address of this machine: that interface); every interface only with
//      bind_all (LOOM_STORE_BIND_ALL=1).
//   2. Who gets in: a challenge-response with HMAC-SHA256 (RFC 2104) in both directions over
//      the job's secret (LOOM_JOB_SECRET, which the launcher makes). The secret never crosses the
//      wire; both sides contribute a fresh random nonce, so a recorded handshake proves nothing
//      later; MACs are compared in constant time. The server proves the secret too, so that a
//      client does not hand its facts to an impostor on the port (another job's store). A
//      server without a secret accepts only clients without one, and both sides say so.
//   3. What a stranger costs: before the proof the server reads 72 bytes of fixed size and
//      nothing whose size the peer chooses; a connection holds a thread until it is dropped
//      (handshake_timeout, 10 s); connections are capped in all and per address (closed at once
//      when over). The other connections go on untouched.
//   4. The log: each refusal or drop is one stderr line, at most once per address and kind of
//      refusal per kLogInterval and kLogLines lines per kLogInterval in all (the next line says
//      how many were left out), so that a flood cannot fill a disk.
//   Not covered: after the handshake the traffic is neither encrypted nor authenticated message
//   by message, so someone on the path can read the values or take over a connection. The store
//   carries addresses and ids, not training data; run jobs on a network you trust.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

#include "data/sha256.h"
#include "dist/store.h"
#include "tensor/error.h"

namespace loom::dist {

namespace {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;  // Deadline::max(): wait as long as it takes
using store_internal::Drop;
using store_internal::Mac;
using store_internal::Nonce;

constexpr uint32_t kMagic = 0x4c4f4f4d;  // "LOOM"
constexpr uint32_t kVersion = 2;         // 2: the handshake of Note [Store security]
constexpr uint32_t kMaxWaitKeys = 1 << 16;

enum Op : uint8_t { kSet = 1, kGet, kAdd, kCompareSet, kWait, kDelete, kNumKeys };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2, kRefused = 3 };

constexpr Milliseconds kForever = std::chrono::hours(24 * 365);

Deadline deadline_after(Milliseconds timeout) {
  return Clock::now() + std::clamp(timeout, Milliseconds(0), kForever);
}

// The poll() timeout until `deadline`, rounded up so that a poll never returns just early.
int poll_timeout_ms(Deadline deadline) {
  if (deadline == Deadline::max()) return -1;
  const auto left = std::chrono::ceil<Milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

std::string errno_text(int err) { return std::strerror(err); }

// A socket failure below the store's API; converted to DistError with the store's address.
struct SocketError {
  std::string what;
  bool closed = false;     // the peer closed the connection (or reset it)
  bool timed_out = false;  // the deadline passed
};

void wait_ready(int fd, short events, Deadline deadline) {
  pollfd p{fd, events, 0};
  while (true) {
    const int n = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (n > 0) return;
    if (n == 0) throw SocketError{"no answer in time", false, true};
    if (errno != EINTR) throw SocketError{"poll: " + errno_text(errno)};
  }
}

void send_all(int fd, const uint8_t* data, size_t n, Deadline deadline) {
  while (n > 0) {
    const ssize_t sent = ::send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      data += sent;
      n -= static_cast<size_t>(sent);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      wait_ready(fd, POLLOUT, deadline);
    } else {
      throw SocketError{"send: " + errno_text(errno),
                        errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN};
    }
  }
}

// Reads 1 to n bytes (n > 0); returns how many.
size_t recv_some(int fd, uint8_t* data, size_t n, Deadline deadline) {
  while (true) {
    const ssize_t got = ::recv(fd, data, n, MSG_DONTWAIT);
    if (got > 0) return static_cast<size_t>(got);
    if (got == 0) throw SocketError{"the connection was closed", true};
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      wait_ready(fd, POLLIN, deadline);
    } else {
      throw SocketError{"recv: " + errno_text(errno), errno == ECONNRESET};
    }
  }
}

void recv_all(int fd, uint8_t* data, size_t n, Deadline deadline) {
  while (n > 0) {
    const size_t got = recv_some(fd, data, n, deadline);
    data += got;
    n -= got;
  }
}

uint32_t load_u32(const uint8_t* b) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(b[i]) << (8 * i);
  return v;
}

int64_t load_i64(const uint8_t* b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
  return static_cast<int64_t>(v);
}

// A request, reply or handshake message being built.
class Message {
 public:
  Message& u8(uint8_t v) {
    bytes_.push_back(v);
    return *this;
  }
  Message& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  Message& i64(int64_t v) {
    const auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<uint8_t>(u >> (8 * i)));
    return *this;
  }
  template <typename Container>  // std::string or Bytes
  Message& str(const Container& s) {
    u32(static_cast<uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  Message& raw(const std::array<uint8_t, 32>& b) {  // a nonce or a MAC: no length
    bytes_.insert(bytes_.end(), b.begin(), b.end());
    return *this;
  }
  void send(int fd, Deadline deadline) const {
    send_all(fd, bytes_.data(), bytes_.size(), deadline);
  }
  Bytes take() { return std::exchange(bytes_, {}); }

 private:
  Bytes bytes_;
};

// Reads the fields of a reply (or the server's handshake) from a socket, on the client.
class Reader {
 public:
  Reader(int fd, Deadline deadline) : fd_(fd), deadline_(deadline) {}
  uint8_t u8() {
    uint8_t v;
    recv_all(fd_, &v, 1, deadline_);
    return v;
  }
  uint32_t u32() {
    uint8_t b[4];
    recv_all(fd_, b, 4, deadline_);
    return load_u32(b);
  }
  int64_t i64() {
    uint8_t b[8];
    recv_all(fd_, b, 8, deadline_);
    return load_i64(b);
  }
  std::array<uint8_t, 32> raw32() {
    std::array<uint8_t, 32> b;
    recv_all(fd_, b.data(), b.size(), deadline_);
    return b;
  }
  // A string of at most `limit` bytes, checked before anything is allocated.
  Bytes bytes(uint32_t limit) {
    const uint32_t n = u32();
    if (n > limit)
      throw SocketError{"protocol error: a field of " + std::to_string(n) +
                        " bytes, over this process's limit of " + std::to_string(limit) +
                        " (LOOM_STORE_MAX_VALUE_BYTES differs between the processes?)"};
    Bytes b(n);
    if (n > 0) recv_all(fd_, b.data(), n, deadline_);
    return b;
  }
  std::string str(uint32_t limit) {
    const Bytes b = bytes(limit);
    return std::string(b.begin(), b.end());
  }

 private:
  int fd_;
  Deadline deadline_;
};

void set_no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string quoted_list(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size(); ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  return out;
}

// What each side MACs: server_nonce || client_nonce || "client" (or "server").
std::string transcript(const Nonce& server_nonce, const Nonce& client_nonce, const char* side) {
  std::string t(server_nonce.begin(), server_nonce.end());
  t.append(client_nonce.begin(), client_nonce.end());
  return t + side;
}

Mac proof(const std::string& secret, const Nonce& server_nonce, const Nonce& client_nonce,
          const char* side) {
  return store_internal::hmac_sha256(secret, transcript(server_nonce, client_nonce, side));
}

}  // namespace

// ---------------------------------------------------------------- HMAC, nonces

namespace store_internal {

namespace {

Mac sha256(std::string_view bytes) {
  const std::string hex = data::sha256_hex(bytes);
  const auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  Mac digest;
  for (size_t i = 0; i < digest.size(); ++i)
    digest[i] = static_cast<uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  return digest;
}

}  // namespace

// RFC 2104: H((K ^ opad) || H((K ^ ipad) || message)), K the key padded with zeros to SHA-256's
// 64-byte block (hashed first when longer), ipad = 0x36..., opad = 0x5c....
Mac hmac_sha256(std::string_view key, std::string_view message) {
  constexpr size_t kBlock = 64;
  std::string padded_key(kBlock, '\0');
  if (key.size() > kBlock) {
    const Mac hashed = sha256(key);
    std::copy(hashed.begin(), hashed.end(), padded_key.begin());
  } else {
    std::copy(key.begin(), key.end(), padded_key.begin());
  }
  std::string inner(kBlock, '\0'), outer(kBlock, '\0');
  for (size_t i = 0; i < kBlock; ++i) {
    inner[i] = static_cast<char>(padded_key[i] ^ 0x36);
    outer[i] = static_cast<char>(padded_key[i] ^ 0x5c);
  }
  inner.append(message);
  const Mac inner_hash = sha256(inner);
  outer.append(inner_hash.begin(), inner_hash.end());
  return sha256(outer);
}

bool equal_in_constant_time(const Mac& a, const Mac& b) {
  volatile uint8_t differ = 0;  // volatile: the compiler may not stop at the first difference
  for (size_t i = 0; i < a.size(); ++i) differ = differ | (a[i] ^ b[i]);
  return differ == 0;
}

Nonce random_nonce() {
  Nonce nonce;
  size_t got = 0;
  while (got < nonce.size()) {
    const ssize_t n = ::getrandom(nonce.data() + got, nonce.size() - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // no getrandom (ENOSYS): the device below
    }
  }
  if (got < nonce.size()) {
    const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    LOOM_CHECK(
        fd >= 0, DistError,
        "TCPStore: no random source: getrandom failed and /dev/urandom: ", errno_text(errno));
    while (got < nonce.size()) {
      const ssize_t n = ::read(fd, nonce.data() + got, nonce.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fd);
        throw DistError("TCPStore: cannot read /dev/urandom: " + errno_text(errno));
      }
      got += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  return nonce;
}

// ---------------------------------------------------------------- the server's data, a session

class StoreData {
 public:
  std::mutex mutex;
  std::condition_variable changed;  // a key was set, or the server is stopping
  std::unordered_map<std::string, Bytes> values;
  bool stopping = false;
};

std::shared_ptr<StoreData> make_store_data() { return std::make_shared<StoreData>(); }

int64_t num_keys(StoreData& data) {
  std::lock_guard<std::mutex> lock(data.mutex);
  return static_cast<int64_t>(data.values.size());
}

// A session reads one item at a time: a fixed-size handshake message, an op, a field's length,
// its bytes, an integer. `item` collects the item's bytes until it holds `item_size`; then
// complete_item() acts on it and says what comes next.
struct ServerSession::Impl {
  enum class Phase {
    kHello,        // magic and version
    kClientNonce,  // the client's nonce
    kProof,        // the client's MAC
    kOp,           // a request's first byte; between requests
    kLength,       // a string field's length
    kString,       // its bytes
    kInt,          // an i64 field
    kCount,        // a wait's number of keys
    kWaiting,      // a get or wait whose keys are not all there
    kClosed,
  };
  enum class Field { kKey, kValue, kInt, kCount };

  std::shared_ptr<StoreData> data;
  std::string secret;
  TCPStoreLimits limits;
  Nonce server_nonce{}, client_nonce{};

  Phase phase = Phase::kHello;
  Bytes item;
  size_t item_size = 8;
  Field field = Field::kKey;  // the string being read (kLength, kString)
  bool proven = false;

  // The request being read.
  uint8_t op = 0;
  std::vector<Bytes> strings;  // keys and values in wire order
  std::vector<int64_t> ints;
  bool have_count = false;
  uint32_t wait_count = 0;
  uint64_t wait_key_bytes = 0;
  Deadline wait_deadline{};

  Message output;
  Drop drop = Drop::kNone;
  std::string why;

  bool accepting() const { return phase != Phase::kWaiting && phase != Phase::kClosed; }

  void expect(Phase next, size_t size) {
    phase = next;
    item.clear();
    item_size = size;
  }

  void close(Drop kind, std::string reason) {
    phase = Phase::kClosed;
    drop = kind;
    why = std::move(reason);
  }

  void complete_item() {
    switch (phase) {
      case Phase::kHello: {
        const uint32_t magic = load_u32(item.data()), version = load_u32(item.data() + 4);
        if (magic != kMagic) {
          close(Drop::kProtocol, loom::detail::str("it does not speak loom's store protocol (its "
                                                   "first 4 bytes were 0x",
                                                   hex32(magic), ", not 'LOOM')"));
        } else if (version != kVersion) {
          // Our hello tells the client which version we speak, so that it can say so too.
          output.u32(kMagic).u32(kVersion).raw(server_nonce);
          close(Drop::kVersion, loom::detail::str("it speaks store protocol version ", version,
                                                  "; this store speaks ", kVersion,
                                                  " (a process of another loom build?)"));
        } else {
          expect(Phase::kClientNonce, client_nonce.size());
        }
        return;
      }
      case Phase::kClientNonce:
        std::copy(item.begin(), item.end(), client_nonce.begin());
        output.u32(kMagic).u32(kVersion).raw(server_nonce);
        expect(Phase::kProof, sizeof(Mac));
        return;
      case Phase::kProof: {
        Mac claimed;
        std::copy(item.begin(), item.end(), claimed.begin());
        if (!equal_in_constant_time(claimed, proof(secret, server_nonce, client_nonce, "client"))) {
          output.u8(kRefused);
          close(Drop::kSecret, "it did not prove the job's secret");
          return;
        }
        proven = true;
        output.u8(kOk).raw(proof(secret, server_nonce, client_nonce, "server"));
        expect(Phase::kOp, 1);
        return;
      }
      case Phase::kOp:
        op = item[0];
        if (op < kSet || op > kNumKeys) {
          close(Drop::kProtocol,
                loom::detail::str("it sent an unknown request (op ", static_cast<int>(op), ")"));
          return;
        }
        strings.clear();
        ints.clear();
        have_count = false;
        wait_count = 0;
        wait_key_bytes = 0;
        next_field();
        return;
      case Phase::kLength: {
        const uint32_t length = load_u32(item.data());
        const bool is_key = field == Field::kKey;
        const uint32_t limit = is_key ? limits.max_key_bytes : limits.max_value_bytes;
        if (length > limit) {
          close(Drop::kSize,
                loom::detail::str("it announced a ", is_key ? "key" : "value", " of ", length,
                                  " bytes, over the store's limit of ", limit));
          return;
        }
        if (op == kWait) {
          wait_key_bytes += length;
          if (wait_key_bytes > limits.max_value_bytes) {
            close(Drop::kSize, loom::detail::str("it announced a wait for keys of more than ",
                                                 limits.max_value_bytes, " bytes together"));
            return;
          }
        }
        expect(Phase::kString, length);  // the bytes are kept as they arrive, not reserved
        return;
      }
      case Phase::kString:
        strings.push_back(std::move(item));
        next_field();
        return;
      case Phase::kInt:
        ints.push_back(load_i64(item.data()));
        next_field();
        return;
      case Phase::kCount:
        wait_count = load_u32(item.data());
        have_count = true;
        if (wait_count > kMaxWaitKeys) {
          close(Drop::kSize, loom::detail::str("it announced a wait for ", wait_count,
                                               " keys, over the store's limit of ", kMaxWaitKeys));
          return;
        }
        next_field();
        return;
      case Phase::kWaiting:
      case Phase::kClosed:
        break;
    }
    LOOM_ASSERT(false, "ServerSession: an item completed in phase ", static_cast<int>(phase));
  }

  static std::string hex32(uint32_t v) {
    char text[9];
    std::snprintf(text, sizeof text, "%08x", v);
    return text;
  }

  // The field the request reads next, in its op's order (Note [Store protocol]); when it has
  // them all, runs it.
  void next_field() {
    const size_t s = strings.size(), i = ints.size();
    std::optional<Field> next;
    switch (op) {
      case kSet:
        if (s < 2) next = s == 0 ? Field::kKey : Field::kValue;
        break;
      case kGet:
      case kAdd:
        if (s == 0) {
          next = Field::kKey;
        } else if (i == 0) {
          next = Field::kInt;
        }
        break;
      case kCompareSet:
        if (s < 3) next = s == 0 ? Field::kKey : Field::kValue;
        break;
      case kWait:
        if (!have_count) {
          next = Field::kCount;
        } else if (s < wait_count) {
          next = Field::kKey;
        } else if (i == 0) {
          next = Field::kInt;
        }
        break;
      case kDelete:
        if (s == 0) next = Field::kKey;
        break;
      default:  // kNumKeys
        break;
    }
    if (!next) {
      run();
      return;
    }
    field = *next;
    if (field == Field::kInt) {
      expect(Phase::kInt, 8);
    } else if (field == Field::kCount) {
      expect(Phase::kCount, 4);
    } else {
      expect(Phase::kLength, 4);
    }
  }

  static std::string text(const Bytes& b) { return std::string(b.begin(), b.end()); }

  // Runs the request read; a get or wait whose keys are missing waits (Phase::kWaiting).
  void run() {
    switch (op) {
      case kSet: {
        {
          std::lock_guard<std::mutex> lock(data->mutex);
          data->values[text(strings[0])] = std::move(strings[1]);
        }
        data->changed.notify_all();
        output.u8(kOk);
        break;
      }
      case kAdd: {
        const std::string key = text(strings[0]);
        int64_t value = 0;
        {
          std::lock_guard<std::mutex> lock(data->mutex);
          auto it = data->values.find(key);
          if (it != data->values.end()) {
            const auto* first = reinterpret_cast<const char*>(it->second.data());
            const auto* last = first + it->second.size();
            const auto [end, ec] = std::from_chars(first, last, value);
            if (ec != std::errc() || end != last || it->second.empty()) {
              const std::string shown(first, first + std::min<size_t>(it->second.size(), 64));
              output.u8(kError).str("its value '" + shown +
                                    (it->second.size() > 64 ? "...'" : "'") +
                                    " is not a decimal integer");
              break;
            }
          }
          if (__builtin_add_overflow(value, ints[0], &value)) {
            output.u8(kError).str(std::string("the sum overflows a 64-bit integer"));
            break;
          }
          const std::string digits = std::to_string(value);
          data->values[key] = Bytes(digits.begin(), digits.end());
        }
        data->changed.notify_all();
        output.u8(kOk).i64(value);
        break;
      }
      case kCompareSet: {
        const std::string key = text(strings[0]);
        Bytes now;
        {
          std::lock_guard<std::mutex> lock(data->mutex);
          auto it = data->values.find(key);
          if (it == data->values.end()) {
            if (strings[1].empty()) now = data->values[key] = std::move(strings[2]);
          } else {
            if (it->second == strings[1]) it->second = std::move(strings[2]);
            now = it->second;
          }
        }
        data->changed.notify_all();
        output.u8(kOk).str(now);
        break;
      }
      case kDelete: {
        std::lock_guard<std::mutex> lock(data->mutex);
        output.u8(kOk).u8(data->values.erase(text(strings[0])) > 0 ? 1 : 0);
        break;
      }
      case kNumKeys: {
        std::lock_guard<std::mutex> lock(data->mutex);
        output.u8(kOk).i64(static_cast<int64_t>(data->values.size()));
        break;
      }
      default: {  // kGet, kWait
        wait_deadline = deadline_after(Milliseconds(ints[0]));
        phase = Phase::kWaiting;
        std::lock_guard<std::mutex> lock(data->mutex);
        try_answer(/*timed_out=*/false);
        return;  // try_answer moved on to the next request if it answered
      }
    }
    expect(Phase::kOp, 1);
  }

  // With data->mutex held: answers the waiting get or wait if its keys are all there, or, when
  // `timed_out`, with the keys still missing. True when it answered.
  bool try_answer(bool timed_out) {
    if (op == kGet) {
      const auto it = data->values.find(text(strings[0]));
      if (it != data->values.end()) {
        output.u8(kOk).str(it->second);
      } else if (timed_out) {
        output.u8(kTimeout);
      } else {
        return false;
      }
    } else {
      std::vector<const Bytes*> missing;
      for (const Bytes& key : strings)
        if (data->values.count(text(key)) == 0) missing.push_back(&key);
      if (missing.empty()) {
        output.u8(kOk);
      } else if (timed_out) {
        output.u8(kTimeout).u32(static_cast<uint32_t>(missing.size()));
        for (const Bytes* key : missing) output.str(*key);
      } else {
        return false;
      }
    }
    expect(Phase::kOp, 1);
    return true;
  }
};

ServerSession::ServerSession(std::shared_ptr<StoreData> data, std::string secret,
                             TCPStoreLimits limits, const Nonce& server_nonce)
    : impl_(std::make_unique<Impl>()) {
  LOOM_ASSERT(data != nullptr);
  impl_->data = std::move(data);
  impl_->secret = std::move(secret);
  impl_->limits = limits;
  impl_->server_nonce = server_nonce;
}

ServerSession::~ServerSession() = default;

size_t ServerSession::wanted() const {
  return impl_->accepting() ? impl_->item_size - impl_->item.size() : 0;
}

size_t ServerSession::consume(const uint8_t* bytes, size_t n) {
  Impl& s = *impl_;
  size_t used = 0;
  while (used < n && s.accepting()) {
    const size_t take = std::min(n - used, s.item_size - s.item.size());
    s.item.insert(s.item.end(), bytes + used, bytes + used + take);
    used += take;
    // An empty string completes as soon as its length is read, without bytes of its own.
    while (s.accepting() && s.item.size() == s.item_size) s.complete_item();
  }
  return used;
}

Bytes ServerSession::take_output() { return impl_->output.take(); }

bool ServerSession::authenticated() const { return impl_->proven; }

bool ServerSession::in_request() const {
  using Phase = Impl::Phase;
  return impl_->proven && !(impl_->phase == Phase::kOp && impl_->item.empty()) &&
         impl_->phase != Phase::kClosed;
}

bool ServerSession::waiting() const { return impl_->phase == Impl::Phase::kWaiting; }
bool ServerSession::closed() const { return impl_->phase == Impl::Phase::kClosed; }
Drop ServerSession::drop() const { return impl_->drop; }
const std::string& ServerSession::why() const { return impl_->why; }

bool ServerSession::wait_and_answer() {
  Impl& s = *impl_;
  LOOM_ASSERT(waiting(), "ServerSession::wait_and_answer: no request is waiting");
  std::unique_lock<std::mutex> lock(s.data->mutex);
  s.data->changed.wait_until(lock, s.wait_deadline,
                             [&] { return s.data->stopping || s.try_answer(false); });
  if (!waiting()) return true;
  if (s.data->stopping) {
    s.phase = Impl::Phase::kClosed;
    return false;
  }
  s.try_answer(/*timed_out=*/true);
  return true;
}

void ServerSession::answer_now() {
  LOOM_ASSERT(waiting(), "ServerSession::answer_now: no request is waiting");
  std::lock_guard<std::mutex> lock(impl_->data->mutex);
  impl_->try_answer(/*timed_out=*/true);
}

}  // namespace store_internal

namespace {

using store_internal::ServerSession;
using store_internal::StoreData;

// ---------------------------------------------------------------- the server's log

// Refusals and drops on stderr, rate-limited (Note [Store security], 4).
class RefusalLog {
 public:
  static constexpr auto kLogInterval = std::chrono::seconds(10);
  static constexpr int kLogLines = 20;
  static constexpr size_t kMaxTracked = 4096;

  // "loom store: <verb> a connection from <peer>: <why>", unless this address was heard of for
  // this kind of refusal within kLogInterval or the lines of this interval are used up.
  void report(const std::string& verb, const std::string& address, const std::string& peer,
              Drop kind, const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = Clock::now();
    if (now - window_start_ >= kLogInterval) {
      window_start_ = now;
      lines_in_window_ = 0;
    }
    const auto key = std::make_pair(address, kind);
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      if (entries_.size() >= kMaxTracked) forget_old(now);
      if (entries_.size() >= kMaxTracked) {  // a flood from many addresses
        ++untracked_;
        return;
      }
      it = entries_.emplace(key, Entry{}).first;
    }
    Entry& entry = it->second;
    const bool due = !entry.logged || now - entry.last >= kLogInterval;
    if (!due || lines_in_window_ >= kLogLines) {
      ++entry.left_out;
      return;
    }
    std::string line = "loom store: " + verb + " a connection from " + peer + ": " + why;
    if (entry.left_out > 0)
      line += loom::detail::str(" (and ", entry.left_out, " more like it from ", address,
                                " not shown)");
    if (untracked_ > 0)
      line += loom::detail::str(" (and ", std::exchange(untracked_, 0),
                                " from other addresses not shown)");
    std::fprintf(stderr, "%s\n", line.c_str());
    entry.logged = true;
    entry.last = now;
    entry.left_out = 0;
    ++lines_in_window_;
  }

 private:
  struct Entry {
    bool logged = false;
    Clock::time_point last{};
    int64_t left_out = 0;
  };
  void forget_old(Clock::time_point now) {
    for (auto it = entries_.begin(); it != entries_.end();)
      it = now - it->second.last >= kLogInterval ? entries_.erase(it) : std::next(it);
  }

  std::mutex mutex_;
  std::map<std::pair<std::string, Drop>, Entry> entries_;
  Clock::time_point window_start_{};
  int lines_in_window_ = 0;
  int64_t untracked_ = 0;
};

// ---------------------------------------------------------------- the server

struct PeerName {
  std::string address;  // "10.0.0.9", "::1": what the caps and the log count by
  std::string text;     // "10.0.0.9:51234", "[::1]:51234"
};

PeerName peer_name(const sockaddr_storage& peer) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (peer.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(peer);
    ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
    port = ntohs(a.sin_port);
    return {host, std::string(host) + ":" + std::to_string(port)};
  }
  if (peer.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(peer);
    ::inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof host);
    port = ntohs(a.sin6_port);
  }
  return {host, "[" + std::string(host) + "]:" + std::to_string(port)};
}

// Where the server listens (Note [Store security], 1), resolved to one numeric address.
struct ListenAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  std::string numeric;  // "127.0.0.1"
  std::string shown;    // for messages: "myhost (10.0.0.5)", or the numeric address
};

ListenAddress listen_address(const TCPStoreOptions& o) {
  ListenAddress out;
  if (o.bind_all) {
    auto& a = reinterpret_cast<sockaddr_in&>(out.storage);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(o.port);
    out.length = sizeof(sockaddr_in);
    out.numeric = "0.0.0.0";
    out.shown = "0.0.0.0 (every interface)";
    return out;
  }
  const std::string& name = o.bind_address.empty() ? o.host : o.bind_address;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(name.c_str(), std::to_string(o.port).c_str(), &hints, &found);
  LOOM_CHECK(rc == 0, DistError, "TCPStore: cannot serve on ", name, ":", o.port,
             ": cannot resolve '", name, "': ", ::gai_strerror(rc));
  // IPv4 first: the clients of a name that has both try each of its addresses in turn.
  const addrinfo* chosen = found;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      chosen = ai;
      break;
    }
  }
  std::memcpy(&out.storage, chosen->ai_addr, chosen->ai_addrlen);
  out.length = chosen->ai_addrlen;
  ::freeaddrinfo(found);
  char numeric[NI_MAXHOST] = "";
  ::getnameinfo(reinterpret_cast<sockaddr*>(&out.storage), out.length, numeric, sizeof numeric,
                nullptr, 0, NI_NUMERICHOST);
  out.numeric = numeric;
  out.shown = name == out.numeric ? name : name + " (" + out.numeric + ")";
  return out;
}

// Why bind failed, with what to do about it.
std::string bind_error(const ListenAddress& where, uint16_t port, int err) {
  const std::string at = loom::detail::str("TCPStore: cannot serve on ", where.shown, ":", port);
  if (err == EADDRINUSE)
    return loom::detail::str(
        at,
        ": the port is already in use. A process from an earlier run may still hold it (find "
        "it with `ss -ltnp 'sport = :",
        port, "'` or `fuser ", port, "/tcp`), or choose another --master-port");
  if (err == EADDRNOTAVAIL)
    return loom::detail::str(
        at, ": ", where.numeric,
        " is not an address of this machine. The store listens on the address the job names "
        "(--master-addr, MASTER_ADDR): name this machine there, or set LOOM_STORE_BIND_ALL=1 "
        "to listen on every interface");
  return at + ": " + errno_text(err);
}

class Server {
 public:
  explicit Server(const TCPStoreOptions& options)
      : secret_(options.secret), limits_(options.limits), data_(store_internal::make_store_data()) {
    ListenAddress where = listen_address(options);
    listen_fd_ = ::socket(where.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    LOOM_CHECK(listen_fd_ >= 0, DistError, "TCPStore: socket: ", errno_text(errno));
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&where.storage), where.length) != 0 ||
        ::listen(listen_fd_, 1024) != 0) {
      const int err = errno;
      ::close(listen_fd_);
      throw DistError(bind_error(where, options.port, err));
    }
    socklen_t len = sizeof(where.storage);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&where.storage), &len);
    port_ = where.storage.ss_family == AF_INET6
                ? ntohs(reinterpret_cast<sockaddr_in6&>(where.storage).sin6_port)
                : ntohs(reinterpret_cast<sockaddr_in&>(where.storage).sin_port);
    connect_host_ = options.bind_all ? "127.0.0.1" : where.numeric;
    if (::pipe2(wake_, O_CLOEXEC) != 0) {
      ::close(listen_fd_);
      throw DistError("TCPStore: pipe: " + errno_text(errno));
    }
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  // Wakes every waiter and every connection, then joins their threads: connected clients see
  // their connection closed (after the reply to a request already being answered).
  ~Server() {
    {
      std::lock_guard<std::mutex> lock(data_->mutex);
      data_->stopping = true;
    }
    stopping_ = true;
    data_->changed.notify_all();
    const char byte = 1;
    [[maybe_unused]] ssize_t ignored = ::write(wake_[1], &byte, 1);
    accept_thread_.join();
    // No more requests; a reply being written still goes out (a client whose set was applied
    // gets its answer even when that set is what let rank 0 finish and close the store).
    for (auto& conn : conns_) ::shutdown(conn->fd, SHUT_RD);
    const auto grace = Clock::now() + std::chrono::seconds(1);
    for (auto& conn : conns_) {
      while (!conn->done && Clock::now() < grace) std::this_thread::sleep_for(Milliseconds(1));
      if (!conn->done) ::shutdown(conn->fd, SHUT_RDWR);  // a client that does not read
    }
    for (auto& conn : conns_) {
      conn->thread.join();
      ::close(conn->fd);
    }
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  uint16_t port() const { return port_; }
  // Where this process's own client connects: the listening address (127.0.0.1 for 0.0.0.0).
  const std::string& connect_host() const { return connect_host_; }

 private:
  struct Connection {
    int fd;
    PeerName peer;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void accept_loop() {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    while (true) {
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
      if (stopping_) break;
      if (!(fds[0].revents & POLLIN)) continue;
      sockaddr_storage peer{};
      socklen_t peer_length = sizeof peer;
      const int fd =
          ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_length, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      admit(fd, peer_name(peer));
    }
  }

  // Serves the connection on a thread of its own, or closes it at once when a cap is reached.
  void admit(int fd, PeerName peer) {
    reap_finished();
    std::string over;
    if (static_cast<int>(conns_.size()) >= limits_.max_connections) {
      over = loom::detail::str(conns_.size(),
                               " connections are open, the most this store takes "
                               "(TCPStoreLimits::max_connections)");
    } else if (const auto it = per_address_.find(peer.address);
               it != per_address_.end() && it->second >= limits_.max_connections_per_peer) {
      over = loom::detail::str(it->second, " connections from ", peer.address,
                               " are open, the most this store takes from one address "
                               "(TCPStoreLimits::max_connections_per_peer)");
    }
    if (!over.empty()) {
      ::close(fd);
      log_.report("refused", peer.address, peer.text, Drop::kCapacity, over);
      return;
    }
    set_no_delay(fd);
    auto conn = std::make_unique<Connection>();
    conn->fd = fd;
    conn->peer = std::move(peer);
    Connection* raw = conn.get();
    try {
      conn->thread = std::thread([this, raw] {
        serve(*raw);
        raw->done = true;
      });
    } catch (const std::system_error& e) {  // out of threads
      ::close(fd);
      log_.report("refused", raw->peer.address, raw->peer.text, Drop::kCapacity,
                  std::string("no thread to serve it: ") + e.what());
      return;
    }
    ++per_address_[raw->peer.address];
    conns_.push_back(std::move(conn));
  }

  // Only the accept thread (and, after it stopped, the destructor) touches conns_ and
  // per_address_.
  void reap_finished() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      Connection& conn = **it;
      if (!conn.done) {
        ++it;
        continue;
      }
      conn.thread.join();
      ::close(conn.fd);
      if (--per_address_[conn.peer.address] <= 0) per_address_.erase(conn.peer.address);
      it = conns_.erase(it);
    }
  }

  // Drives a session over the socket: reads no more than the session wants, under the deadline
  // of its phase (the handshake's from the connection's start, a request's from its first byte,
  // none between requests), and sends what it answers.
  void serve(Connection& conn) {
    std::unique_ptr<ServerSession> session;
    try {
      session =
          std::make_unique<ServerSession>(data_, secret_, limits_, store_internal::random_nonce());
    } catch (const Error& e) {
      log_.report("refused", conn.peer.address, conn.peer.text, Drop::kCapacity, e.what());
      ::shutdown(conn.fd, SHUT_RDWR);
      return;
    }
    const Deadline handshake_deadline = deadline_after(limits_.handshake_timeout);
    Deadline request_deadline = Deadline::max();
    Bytes buffer(64 << 10);
    std::string stalled;
    try {
      while (!session->closed()) {
        if (session->waiting()) {
          if (!session->wait_and_answer()) break;  // the server is stopping
        } else {
          const bool idle = session->authenticated() && !session->in_request();
          const Deadline deadline = !session->authenticated() ? handshake_deadline
                                    : idle                    ? Deadline::max()
                                                              : request_deadline;
          size_t got = 0;
          try {
            got = recv_some(conn.fd, buffer.data(), std::min(session->wanted(), buffer.size()),
                            deadline);
          } catch (const SocketError& e) {
            if (e.timed_out)
              stalled = session->authenticated()
                            ? loom::detail::str("it did not finish a request within ",
                                                limits_.request_timeout.count(), " ms")
                            : loom::detail::str("it did not finish the handshake within ",
                                                limits_.handshake_timeout.count(), " ms");
            throw;
          }
          session->consume(buffer.data(), got);
          if (idle && session->in_request())
            request_deadline = deadline_after(limits_.request_timeout);
        }
        const Bytes out = session->take_output();
        try {
          if (!out.empty())
            send_all(conn.fd, out.data(), out.size(), deadline_after(limits_.request_timeout));
        } catch (const SocketError& e) {
          if (e.timed_out)
            stalled = loom::detail::str("it did not take the store's reply within ",
                                        limits_.request_timeout.count(), " ms");
          throw;
        }
      }
    } catch (const SocketError&) {
      // The peer went away, stalled, or we are shutting down: nothing more to answer.
    }
    const std::string verb = session->authenticated() ? "dropped" : "refused";
    if (!stalled.empty()) {
      log_.report(verb, conn.peer.address, conn.peer.text, Drop::kStall, stalled);
    } else if (session->drop() != Drop::kNone) {
      log_.report(verb, conn.peer.address, conn.peer.text, session->drop(), session->why());
    }
    // The peer sees the connection end now; the accept thread closes the socket later.
    ::shutdown(conn.fd, SHUT_RDWR);
  }

  std::string secret_;
  TCPStoreLimits limits_;
  std::shared_ptr<StoreData> data_;
  RefusalLog log_;

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  uint16_t port_ = 0;
  std::string connect_host_;
  std::thread accept_thread_;
  std::list<std::unique_ptr<Connection>> conns_;
  std::unordered_map<std::string, int> per_address_;  // open connections by peer address
  std::atomic<bool> stopping_{false};
};

// ---------------------------------------------------------------- connecting

// One attempt at every address of host:port; the connected socket, or -1 and `error`.
int try_connect(const std::string& host, uint16_t port, Deadline deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    error = std::string("cannot resolve the host: ") + ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      error = "socket: " + errno_text(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int n;
        while ((n = ::poll(&p, 1, poll_timeout_ms(deadline))) < 0 && errno == EINTR) {
        }
        socklen_t len = sizeof(err);
        if (n == 1) {
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        } else {
          err = ETIMEDOUT;
        }
      }
    }
    if (err != 0) {
      error = errno_text(err);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd >= 0) {
    const int flags = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);  // I/O uses poll with MSG_DONTWAIT anyway
    set_no_delay(fd);
  }
  return fd;
}

}  // namespace

// ---------------------------------------------------------------- TCPStore

struct TCPStore::Impl {
  TCPStoreOptions options;
  uint16_t port = 0;
  std::string address;  // host:port, for messages
  std::unique_ptr<Server> server;

  std::mutex pool_mutex;
  std::vector<int> idle;  // connected sockets no thread is using
  std::string lost;       // why the store is unusable; empty while it works

  std::string prefix() const { return "TCPStore at " + address + ": "; }

  // The client's half of the handshake (Note [Store security]): SocketError when the
  // connection fails (the caller may retry), DistError when the answer is final.
  void handshake(int fd, Deadline deadline) {
    const Nonce mine = store_internal::random_nonce();
    Message().u32(kMagic).u32(kVersion).raw(mine).send(fd, deadline);
    Reader in(fd, deadline);
    const uint32_t magic = in.u32();
    LOOM_CHECK(magic == kMagic, DistError, prefix(),
               "the server there does not speak loom's store protocol (is MASTER_PORT another "
               "program's port?)");
    const uint32_t version = in.u32();
    LOOM_CHECK(version == kVersion, DistError, prefix(),
               "the server speaks store protocol version ", version, ", this process version ",
               kVersion, ": are all processes of the job the same loom build?");
    const Nonce theirs = in.raw32();
    Message().raw(proof(options.secret, theirs, mine, "client")).send(fd, deadline);
    const uint8_t status = in.u8();
    LOOM_CHECK(status != kRefused, DistError, "the store at ", address,
               " refused this process: LOOM_JOB_SECRET differs from the job's",
               options.secret.empty() ? " (this process has none: was it started by the job's "
                                        "launcher?)"
                                      : "");
    if (status != kOk)
      throw SocketError{"protocol error: handshake status " + std::to_string(status)};
    LOOM_CHECK(store_internal::equal_in_constant_time(
                   in.raw32(), proof(options.secret, theirs, mine, "server")),
               DistError, prefix(),
               "the server did not prove the job's secret: it is not this job's store (another "
               "job's on the same port?); check --master-addr, --master-port and LOOM_JOB_SECRET");
  }

  // Connects and shakes hands. The first connection retries until `timeout` (the server may not
  // be up yet); a later one retries only while the server closes it at once (it is over its
  // connection caps: a stranger may be holding them), and fails at once when nothing listens.
  int connect(Milliseconds timeout, bool first) {
    const std::string host = server ? server->connect_host() : options.host;
    const Deadline deadline = deadline_after(timeout);
    std::string error = "no attempt made";
    auto backoff = Milliseconds(10);
    while (true) {
      bool retry = first;
      const int fd = try_connect(host, port, deadline, error);
      if (fd >= 0) {
        try {
          handshake(fd, std::min(deadline, deadline_after(options.limits.handshake_timeout)));
          return fd;
        } catch (const SocketError& e) {
          ::close(fd);
          error = "handshake: " + e.what;
          retry = first || e.closed;
        } catch (...) {
          ::close(fd);
          throw;
        }
      }
      const auto now = Clock::now();
      if (!retry || now >= deadline) {
        throw DistError(loom::detail::str(prefix(), "gave up connecting to the store server after ",
                                          timeout.count(), " ms (last error: ", error, ")"));
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, Milliseconds(200));
    }
  }

  int acquire() {
    {
      std::lock_guard<std::mutex> lock(pool_mutex);
      if (!lost.empty()) throw DistError(prefix() + lost);
      if (!idle.empty()) {
        const int fd = idle.back();
        idle.pop_back();
        return fd;
      }
    }
    return connect(options.timeout, /*first=*/false);
  }

  void release(int fd) {
    std::lock_guard<std::mutex> lock(pool_mutex);
    idle.push_back(fd);
  }

  // What the server would refuse, refused here with the call and the sizes (the server would
  // drop the connection).
  void check_key(const std::string& what, const std::string& key) const {
    LOOM_CHECK(key.size() <= options.limits.max_key_bytes, DistError, prefix(), what,
               ": the key is ", key.size(), " bytes, over the store's limit of ",
               options.limits.max_key_bytes, " (TCPStoreLimits::max_key_bytes)");
  }
  void check_value(const std::string& what, const Bytes& value) const {
    LOOM_CHECK(value.size() <= options.limits.max_value_bytes, DistError, prefix(), what,
               ": the value is ", value.size(), " bytes, over the store's limit of ",
               options.limits.max_value_bytes,
               " (TCPStoreLimits::max_value_bytes, LOOM_STORE_MAX_VALUE_BYTES)");
  }

  // Sends `request`, then `read_reply(reader)` reads the whole reply and returns the result.
  // `what` describes the call for messages ("get('key')"); `server_wait` is how long the server
  // may legitimately take (get and wait).
  template <typename ReadReply>
  auto call(const std::string& what, const Message& request, Milliseconds server_wait,
            Milliseconds store_timeout, ReadReply read_reply) {
    const int fd = acquire();
    // The reply's deadline: the server's own wait, then the store's timeout for the answer.
    const Deadline deadline =
        deadline_after(std::clamp(server_wait, Milliseconds(0), kForever) +
                       std::clamp(store_timeout, Milliseconds(1000), kForever));
    try {
      request.send(fd, deadline);
      Reader in(fd, deadline);
      auto result = read_reply(in);  // may throw DistError once the reply is fully read
      release(fd);
      return result;
    } catch (const SocketError& e) {
      ::close(fd);
      if (e.closed) {
        std::lock_guard<std::mutex> lock(pool_mutex);
        lost =
            "the store server closed the connection (has the process serving it, rank 0 or the "
            "launcher, exited?)";
        throw DistError(prefix() + what + " failed: " + lost);
      }
      throw DistError(prefix() + what + " failed: " + e.what);
    } catch (const DistError&) {
      release(fd);
      throw;
    }
  }

  uint8_t status(Reader& in, const std::string& what) {
    const uint8_t s = in.u8();
    if (s > kError)
      throw SocketError{"protocol error: status " + std::to_string(s) + " for " + what};
    return s;
  }

  ~Impl() {
    for (int fd : idle) ::close(fd);
    server.reset();  // after our own connections are closed
  }
};

TCPStore::TCPStore(TCPStoreOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  timeout_ = impl_->options.timeout;
  impl_->port = impl_->options.port;
  if (impl_->options.is_server) {
    impl_->server = std::make_unique<Server>(impl_->options);
    impl_->port = impl_->server->port();
  }
  impl_->address = impl_->options.host + ":" + std::to_string(impl_->port);
  impl_->idle.push_back(impl_->connect(impl_->options.timeout, /*first=*/true));
}

TCPStore::~TCPStore() = default;

uint16_t TCPStore::port() const { return impl_->port; }
const std::string& TCPStore::host() const { return impl_->options.host; }

void TCPStore::set(const std::string& key, const Bytes& value) {
  const std::string what = "set('" + key + "')";
  impl_->check_key(what, key);
  impl_->check_value(what, value);
  impl_->call(what, Message().u8(kSet).str(key).str(value), Milliseconds(0), timeout_,
              [&](Reader& in) { return impl_->status(in, what); });
}

Bytes TCPStore::get(const std::string& key, Milliseconds timeout) {
  const std::string what = "get('" + key + "')";
  impl_->check_key(what, key);
  return impl_->call(
      what, Message().u8(kGet).str(key).i64(timeout.count()), timeout, timeout_, [&](Reader& in) {
        if (impl_->status(in, what) == kOk) return in.bytes(impl_->options.limits.max_value_bytes);
        throw DistError(loom::detail::str(impl_->prefix(), what, " timed out after ",
                                          timeout.count(), " ms waiting for the key to be set"));
      });
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  const std::string what = "add('" + key + "', " + std::to_string(delta) + ")";
  impl_->check_key(what, key);
  return impl_->call(what, Message().u8(kAdd).str(key).i64(delta), Milliseconds(0), timeout_,
                     [&](Reader& in) {
                       if (impl_->status(in, what) == kOk) return in.i64();
                       throw DistError(impl_->prefix() + what + ": " + in.str(64 << 10));
                     });
}

Bytes TCPStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const std::string what = "compare_set('" + key + "')";
  impl_->check_key(what, key);
  impl_->check_value(what, expected);
  impl_->check_value(what, desired);
  return impl_->call(what, Message().u8(kCompareSet).str(key).str(expected).str(desired),
                     Milliseconds(0), timeout_, [&](Reader& in) {
                       impl_->status(in, what);
                       return in.bytes(impl_->options.limits.max_value_bytes);
                     });
}

void TCPStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  const std::string what = "wait(" + quoted_list(keys) + ")";
  LOOM_CHECK(keys.size() <= kMaxWaitKeys, DistError, impl_->prefix(), "wait: ", keys.size(),
             " keys, over the store's limit of ", kMaxWaitKeys, " in one wait");
  size_t key_bytes = 0;
  for (const std::string& k : keys) {
    impl_->check_key("wait", k);
    key_bytes += k.size();
  }
  LOOM_CHECK(key_bytes <= impl_->options.limits.max_value_bytes, DistError, impl_->prefix(),
             "wait: keys of ", key_bytes, " bytes together, over the store's limit of ",
             impl_->options.limits.max_value_bytes);
  Message request;
  request.u8(kWait).u32(static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) request.str(k);
  request.i64(timeout.count());
  impl_->call(what, request, timeout, timeout_, [&](Reader& in) {
    if (impl_->status(in, what) == kOk) return 0;
    const uint32_t count = in.u32();
    if (count > keys.size())
      throw SocketError{"protocol error: " + std::to_string(count) + " keys missing of " +
                        std::to_string(keys.size())};
    std::vector<std::string> missing(count);
    for (std::string& k : missing) k = in.str(impl_->options.limits.max_key_bytes);
    throw DistError(loom::detail::str(impl_->prefix(), "wait timed out after ", timeout.count(),
                                      " ms; keys still missing: ", quoted_list(missing)));
  });
}

bool TCPStore::delete_key(const std::string& key) {
  const std::string what = "delete_key('" + key + "')";
  impl_->check_key(what, key);
  return impl_->call(what, Message().u8(kDelete).str(key), Milliseconds(0), timeout_,
                     [&](Reader& in) {
                       impl_->status(in, what);
                       return in.u8() != 0;
                     });
}

int64_t TCPStore::num_keys() {
  return impl_->call("num_keys()", Message().u8(kNumKeys), Milliseconds(0), timeout_,
                     [&](Reader& in) {
                       impl_->status(in, "num_keys()");
                       return in.i64();
                     });
}

}  // namespace loom::dist
