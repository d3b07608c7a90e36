// fuzz/store_protocol_fuzzer.cpp — the store server's side of a connection (ServerSession in
// dist/store.h: bytes in, replies out, no socket) on arbitrary bytes, in-process. The first byte
// chooses how: bit 0 set, the fuzzer first performs a valid handshake with the session's secret,
// so that the rest reaches the requests; bits 1-4, the size of the pieces the rest is fed in
// (1 to 15 bytes; 0: as much as the session wants). Small limits (keys of 64 bytes, values of
// 256) so that the caps are reached. What must hold (besides no crash, no sanitizer report, no
// exception at all, no allocation beyond the limits):
//   - the session takes no more than it is offered, and wants bytes exactly while it is neither
//     closed nor waiting;
//   - a peer that has not proven the secret gets nothing but the handshake's bytes and changes
//     nothing in the store;
//   - a session dropped for a size announced too large took nothing after that length.

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "dist/store.h"
#include "fuzz/fuzz_util.h"

namespace {

using loom::dist::Bytes;
namespace store = loom::dist::store_internal;

const std::string kSecret = "the fuzzer's job secret";
constexpr uint32_t kMagic = 0x4c4f4f4d, kVersion = 2;

store::Nonce filled(uint8_t byte) {
  store::Nonce n;
  n.fill(byte);
  return n;
}

void append_u32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Feeds bytes to the session as a server would (answering a waiting get or wait at once);
// returns how many it took and appends what it answered to `replies`.
size_t feed(store::ServerSession& session, const uint8_t* data, size_t size, size_t piece,
            Bytes& replies) {
  size_t at = 0;
  while (at < size && !session.closed()) {
    if (session.waiting()) {
      loom::fuzz::require(session.wanted() == 0, "a waiting session wants no bytes");
      session.answer_now();
      continue;
    }
    const size_t wanted = session.wanted();
    loom::fuzz::require(wanted > 0, "a session neither closed nor waiting wants bytes");
    const size_t offered = std::min(size - at, piece == 0 ? wanted : piece);
    const size_t taken = session.consume(data + at, offered);
    loom::fuzz::require(taken <= offered, "a session takes no more than it is offered");
    loom::fuzz::require(taken > 0 || session.closed() || session.waiting(),
                        "a session that wants bytes takes some");
    at += taken;
    const Bytes out = session.take_output();
    replies.insert(replies.end(), out.begin(), out.end());
  }
  if (session.waiting()) session.answer_now();
  const Bytes out = session.take_output();
  replies.insert(replies.end(), out.begin(), out.end());
  if (session.closed()) {
    loom::fuzz::require(session.wanted() == 0, "a closed session wants no bytes");
    const uint8_t more = 0;
    loom::fuzz::require(session.consume(&more, 1) == 0, "a closed session takes no bytes");
  }
  return at;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool handshake = (data[0] & 1) != 0;
  const size_t piece = (data[0] >> 1) & 15;
  ++data;
  --size;

  loom::dist::TCPStoreLimits limits;
  limits.max_key_bytes = 64;
  limits.max_value_bytes = 256;
  const auto store_data = store::make_store_data();
  const store::Nonce server_nonce = filled(0x11), client_nonce = filled(0x22);
  store::ServerSession session(store_data, kSecret, limits, server_nonce);

  Bytes replies;
  if (handshake) {
    Bytes hello;
    append_u32(hello, kMagic);
    append_u32(hello, kVersion);
    hello.insert(hello.end(), client_nonce.begin(), client_nonce.end());
    std::string transcript(server_nonce.begin(), server_nonce.end());
    transcript.append(client_nonce.begin(), client_nonce.end());
    const store::Mac proof = store::hmac_sha256(kSecret, transcript + "client");
    hello.insert(hello.end(), proof.begin(), proof.end());
    feed(session, hello.data(), hello.size(), 0, replies);
    const store::Mac server_proof = store::hmac_sha256(kSecret, transcript + "server");
    loom::fuzz::require(
        session.authenticated() && replies.size() == 40 + 1 + 32 && replies[40] == 0 &&
            std::equal(server_proof.begin(), server_proof.end(), replies.begin() + 41),
        "the valid handshake is accepted and the server proves the secret back");
    replies.clear();
  }

  feed(session, data, size, piece, replies);

  if (!session.authenticated()) {
    loom::fuzz::require(replies.size() <= 40 + 1,
                        "an unproven peer gets only the server's hello and a refusal");
    loom::fuzz::require(store::num_keys(*store_data) == 0,
                        "an unproven peer changes nothing in the store");
  }
  if (session.drop() == store::Drop::kSecret)
    loom::fuzz::require(!session.authenticated(), "a refused peer is not authenticated");
  return 0;
}
