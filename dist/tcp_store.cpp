// dist/tcp_store.cpp — TCPStore: the server (a thread per connection; get and wait block on a
// condition variable until the key appears or their timeout passes) and the client (a small
// pool of connections, so that one thread blocked in get does not hold up another's set).
//
// Note [Store protocol]
//   Integers are little-endian; a string is its length (u32) and its bytes. A connection opens
//   with the client sending kMagic and kVersion (u32 each) and the server echoing them. Then
//   one request at a time: an op (u8) and its fields; the reply is a status (u8: kOk, kTimeout,
//   kError) and its fields.
//     SET key value            -> ok
//     GET key timeout_ms       -> ok value | timeout          (the server waits, not the client)
//     ADD key delta            -> ok new_value | error message
//     COMPARE_SET key exp new  -> ok value_afterwards
//     WAIT n key... timeout_ms -> ok | timeout n key...       (the keys still missing)
//     DELETE key               -> ok existed(u8)
//     NUM_KEYS                 -> ok count
//   A server that shuts down closes every connection: clients see end-of-file and raise
//   DistError at once (and on every later call: the store's state is gone with the server).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "dist/store.h"
#include "tensor/error.h"

namespace loom::dist {

namespace {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;  // Deadline::max(): wait as long as it takes

constexpr uint32_t kMagic = 0x4c4f4f4d;  // "LOOM"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxStringBytes = 1u << 30;

enum Op : uint8_t { kSet = 1, kGet, kAdd, kCompareSet, kWait, kDelete, kNumKeys };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

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
  bool closed = false;  // the peer closed the connection (or reset it)
};

void wait_ready(int fd, short events, Deadline deadline) {
  pollfd p{fd, events, 0};
  while (true) {
    const int n = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (n > 0) return;
    if (n == 0) throw SocketError{"no answer in time"};
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

void recv_all(int fd, uint8_t* data, size_t n, Deadline deadline) {
  while (n > 0) {
    const ssize_t got = ::recv(fd, data, n, MSG_DONTWAIT);
    if (got > 0) {
      data += got;
      n -= static_cast<size_t>(got);
    } else if (got == 0) {
      throw SocketError{"the connection was closed", true};
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      wait_ready(fd, POLLIN, deadline);
    } else {
      throw SocketError{"recv: " + errno_text(errno), errno == ECONNRESET};
    }
  }
}

// A request or reply being built.
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
  void send(int fd, Deadline deadline) const {
    send_all(fd, bytes_.data(), bytes_.size(), deadline);
  }

 private:
  Bytes bytes_;
};

// Reads the fields of a request or reply from a socket.
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
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(b[i]) << (8 * i);
    return v;
  }
  int64_t i64() {
    uint8_t b[8];
    recv_all(fd_, b, 8, deadline_);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
    return static_cast<int64_t>(v);
  }
  Bytes bytes() {
    const uint32_t n = u32();
    if (n > kMaxStringBytes)
      throw SocketError{"protocol error: a field of " + std::to_string(n) + " bytes"};
    Bytes b(n);
    if (n > 0) recv_all(fd_, b.data(), n, deadline_);
    return b;
  }
  std::string str() {
    const Bytes b = bytes();
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

// ---------------------------------------------------------------- server

class Server {
 public:
  explicit Server(uint16_t port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    LOOM_CHECK(listen_fd_ >= 0, DistError, "TCPStore: socket: ", errno_text(errno));
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);  // every interface: ranks on other machines too
    addr.sin_port = htons(port);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_fd_, 1024) != 0) {
      const int err = errno;
      ::close(listen_fd_);
      throw DistError(
          detail::str("TCPStore: cannot serve on 0.0.0.0:", port, ": ", errno_text(err)));
    }
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
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
      std::lock_guard<std::mutex> lock(data_mutex_);
      stopping_ = true;
    }
    data_cv_.notify_all();
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

 private:
  struct Connection {
    int fd;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void accept_loop() {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    while (true) {
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
      if (stopping_) break;
      if (!(fds[0].revents & POLLIN)) continue;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      set_no_delay(fd);
      reap_finished();
      auto conn = std::make_unique<Connection>();
      conn->fd = fd;
      Connection* raw = conn.get();
      conn->thread = std::thread([this, raw] {
        serve(raw->fd);
        raw->done = true;
      });
      conns_.push_back(std::move(conn));
    }
  }

  // Only the accept thread (and, after it stopped, the destructor) touches conns_.
  void reap_finished() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->done) {
        (*it)->thread.join();
        ::close((*it)->fd);
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void serve(int fd) {
    try {
      Reader in(fd, Deadline::max());
      if (in.u32() != kMagic || in.u32() != kVersion) return;
      Message().u32(kMagic).u32(kVersion).send(fd, Deadline::max());
      while (!stopping_) {
        const uint8_t op = in.u8();
        Message reply;
        if (!handle(op, in, reply)) return;  // shutting down, or an unknown op
        reply.send(fd, Deadline::max());
      }
    } catch (const SocketError&) {
      // The client went away (or we are shutting down): nothing to answer.
    }
  }

  // Waits (releasing the lock) until `ready` or the deadline; false if the server stops.
  template <typename Ready>
  bool wait_until(std::unique_lock<std::mutex>& lock, Deadline deadline, Ready ready) {
    data_cv_.wait_until(lock, deadline, [&] { return stopping_ || ready(); });
    return !stopping_;
  }

  bool handle(uint8_t op, Reader& in, Message& reply) {
    switch (op) {
      case kSet: {
        std::string key = in.str();
        Bytes value = in.bytes();
        {
          std::lock_guard<std::mutex> lock(data_mutex_);
          data_[std::move(key)] = std::move(value);
        }
        data_cv_.notify_all();
        reply.u8(kOk);
        return true;
      }
      case kGet: {
        const std::string key = in.str();
        const Deadline deadline = deadline_after(Milliseconds(in.i64()));
        std::unique_lock<std::mutex> lock(data_mutex_);
        if (!wait_until(lock, deadline, [&] { return data_.count(key) > 0; })) return false;
        auto it = data_.find(key);
        if (it == data_.end()) {
          reply.u8(kTimeout);
        } else {
          reply.u8(kOk).str(it->second);
        }
        return true;
      }
      case kAdd: {
        const std::string key = in.str();
        const int64_t delta = in.i64();
        int64_t value = 0;
        {
          std::lock_guard<std::mutex> lock(data_mutex_);
          auto it = data_.find(key);
          if (it != data_.end()) {
            const auto* first = reinterpret_cast<const char*>(it->second.data());
            const auto* last = first + it->second.size();
            const auto [end, ec] = std::from_chars(first, last, value);
            if (ec != std::errc() || end != last || it->second.empty()) {
              reply.u8(kError).str(std::string("its value '") + std::string(first, last) +
                                   "' is not a decimal integer");
              return true;
            }
          }
          value += delta;
          const std::string text = std::to_string(value);
          data_[key] = Bytes(text.begin(), text.end());
        }
        data_cv_.notify_all();
        reply.u8(kOk).i64(value);
        return true;
      }
      case kCompareSet: {
        const std::string key = in.str();
        const Bytes expected = in.bytes();
        Bytes desired = in.bytes();
        Bytes now;
        {
          std::lock_guard<std::mutex> lock(data_mutex_);
          auto it = data_.find(key);
          if (it == data_.end()) {
            if (expected.empty()) now = data_[key] = std::move(desired);
          } else {
            if (it->second == expected) it->second = std::move(desired);
            now = it->second;
          }
        }
        data_cv_.notify_all();
        reply.u8(kOk).str(now);
        return true;
      }
      case kWait: {
        const uint32_t n = in.u32();
        if (n > (1u << 20)) throw SocketError{"protocol error: waiting for too many keys"};
        std::vector<std::string> keys;
        for (uint32_t i = 0; i < n; ++i) keys.push_back(in.str());
        const Deadline deadline = deadline_after(Milliseconds(in.i64()));
        std::unique_lock<std::mutex> lock(data_mutex_);
        const auto all_present = [&] {
          return std::all_of(keys.begin(), keys.end(),
                             [&](const std::string& k) { return data_.count(k) > 0; });
        };
        if (!wait_until(lock, deadline, all_present)) return false;
        std::vector<std::string> missing;
        for (const std::string& k : keys)
          if (data_.count(k) == 0) missing.push_back(k);
        if (missing.empty()) {
          reply.u8(kOk);
        } else {
          reply.u8(kTimeout).u32(static_cast<uint32_t>(missing.size()));
          for (const std::string& k : missing) reply.str(k);
        }
        return true;
      }
      case kDelete: {
        const std::string key = in.str();
        std::lock_guard<std::mutex> lock(data_mutex_);
        reply.u8(kOk).u8(data_.erase(key) > 0 ? 1 : 0);
        return true;
      }
      case kNumKeys: {
        std::lock_guard<std::mutex> lock(data_mutex_);
        reply.u8(kOk).i64(static_cast<int64_t>(data_.size()));
        return true;
      }
      default:
        return false;  // not our protocol: drop the connection
    }
  }

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  uint16_t port_ = 0;
  std::thread accept_thread_;
  std::list<std::unique_ptr<Connection>> conns_;

  std::mutex data_mutex_;
  std::condition_variable data_cv_;
  std::unordered_map<std::string, Bytes> data_;
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

  // Connects and shakes hands; retries until `timeout` when `retry` (the first connection: the
  // server may not be up yet), else one attempt (the server was there and went away).
  int connect(Milliseconds timeout, bool retry) {
    const std::string host = server ? "127.0.0.1" : options.host;
    const Deadline deadline = deadline_after(timeout);
    std::string error = "no attempt made";
    auto backoff = Milliseconds(10);
    while (true) {
      int fd = try_connect(host, port, deadline, error);
      if (fd >= 0) {
        try {
          Message().u32(kMagic).u32(kVersion).send(fd, deadline);
          Reader in(fd, deadline);
          if (in.u32() == kMagic && in.u32() == kVersion) return fd;
          ::close(fd);
          throw DistError(prefix() + "the server there does not speak loom's store protocol");
        } catch (const SocketError& e) {
          ::close(fd);
          error = "handshake: " + e.what;
        }
      }
      const auto now = Clock::now();
      if (!retry || now >= deadline) {
        throw DistError(detail::str(prefix(), "gave up connecting to the store server after ",
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
    return connect(options.timeout, /*retry=*/false);
  }

  void release(int fd) {
    std::lock_guard<std::mutex> lock(pool_mutex);
    idle.push_back(fd);
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
        lost = "the store server closed the connection (has rank 0 exited?)";
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
    impl_->server = std::make_unique<Server>(impl_->options.port);
    impl_->port = impl_->server->port();
  }
  impl_->address = impl_->options.host + ":" + std::to_string(impl_->port);
  impl_->idle.push_back(impl_->connect(impl_->options.timeout, /*retry=*/true));
}

TCPStore::~TCPStore() = default;

uint16_t TCPStore::port() const { return impl_->port; }
const std::string& TCPStore::host() const { return impl_->options.host; }

void TCPStore::set(const std::string& key, const Bytes& value) {
  const std::string what = "set('" + key + "')";
  impl_->call(what, Message().u8(kSet).str(key).str(value), Milliseconds(0), timeout_,
              [&](Reader& in) { return impl_->status(in, what); });
}

Bytes TCPStore::get(const std::string& key, Milliseconds timeout) {
  const std::string what = "get('" + key + "')";
  return impl_->call(
      what, Message().u8(kGet).str(key).i64(timeout.count()), timeout, timeout_, [&](Reader& in) {
        if (impl_->status(in, what) == kOk) return in.bytes();
        throw DistError(detail::str(impl_->prefix(), what, " timed out after ", timeout.count(),
                                    " ms waiting for the key to be set"));
      });
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  const std::string what = "add('" + key + "', " + std::to_string(delta) + ")";
  return impl_->call(what, Message().u8(kAdd).str(key).i64(delta), Milliseconds(0), timeout_,
                     [&](Reader& in) {
                       if (impl_->status(in, what) == kOk) return in.i64();
                       throw DistError(impl_->prefix() + what + ": " + in.str());
                     });
}

Bytes TCPStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const std::string what = "compare_set('" + key + "')";
  return impl_->call(what, Message().u8(kCompareSet).str(key).str(expected).str(desired),
                     Milliseconds(0), timeout_, [&](Reader& in) {
                       impl_->status(in, what);
                       return in.bytes();
                     });
}

void TCPStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  const std::string what = "wait(" + quoted_list(keys) + ")";
  Message request;
  request.u8(kWait).u32(static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) request.str(k);
  request.i64(timeout.count());
  impl_->call(what, request, timeout, timeout_, [&](Reader& in) {
    if (impl_->status(in, what) == kOk) return 0;
    std::vector<std::string> missing(in.u32());
    for (std::string& k : missing) k = in.str();
    throw DistError(detail::str(impl_->prefix(), "wait timed out after ", timeout.count(),
                                " ms; keys still missing: ", quoted_list(missing)));
  });
}

bool TCPStore::delete_key(const std::string& key) {
  const std::string what = "delete_key('" + key + "')";
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
