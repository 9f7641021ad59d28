// Sample payloads and the handle that lets metadata run ahead of them.
//
// A source loader publishes a sample's metadata as soon as it knows it, and its payload
// (tokens, loss mask, decoded images) when the transform has finished. PayloadRef is the
// shared handle between the two: the planner passes it along without looking; the
// constructor calls Get(), which blocks until the payload is ready. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "braid/status.h"

namespace braid {

/// One decoded image cut into patches (source/image.h): `pixels` holds
/// grid_h * grid_w patches in row-major grid order, each 3 * p * p floats, channel-first
/// within the patch ([c][y][x]). Its grid_h * grid_w placeholder tokens are in `tokens`.
struct ImagePatches {
  int32_t grid_h = 0;
  int32_t grid_w = 0;
  std::vector<float> pixels;

  int64_t num_patches() const { return int64_t{grid_h} * grid_w; }
};

/// What a constructor needs of a sample: its tokens and, where the transform says which
/// tokens are targets (chat data), a per-token loss mask.
struct Payload {
  std::vector<int32_t> tokens;
  /// Empty: every token is a target. Else one 0/1 per token: 1 where predicting that
  /// token is trained (e.g. response tokens of a chat).
  std::vector<uint8_t> loss_mask;
  /// Images of an image-caption sample, in token order. INVARIANT: image k's placeholders
  /// are the tokens [image_start[k], image_start[k] + images[k].num_patches()).
  std::vector<ImagePatches> images;
  std::vector<int64_t> image_start;

  /// Bytes held, for read-ahead accounting.
  int64_t bytes() const {
    int64_t b =
        static_cast<int64_t>(tokens.size() * sizeof(int32_t) + loss_mask.size());
    for (const auto& im : images) {
      b += static_cast<int64_t>(im.pixels.size() * sizeof(float));
    }
    return b + static_cast<int64_t>(image_start.size() * sizeof(int64_t));
  }
};

using TokenPayload = std::shared_ptr<const Payload>;

/// A payload of plain tokens.
inline TokenPayload MakeTokenPayload(std::vector<int32_t> tokens) {
  auto p = std::make_shared<Payload>();
  p->tokens = std::move(tokens);
  return p;
}

/// A shared handle to a payload that is ready or still being produced. Copies share it.
class PayloadRef {
 public:
  /// No payload.
  PayloadRef() = default;
  /// A ready payload (null: no payload).
  PayloadRef(TokenPayload ready);  // NOLINT: implicit, a ready payload is a PayloadRef

  /// A payload still to be produced; complete it with Set().
  static PayloadRef Pending();

  /// Completes a pending payload (once); wakes every waiter.
  void Set(Result<TokenPayload> result) const;

  /// True if a payload exists, ready or pending.
  explicit operator bool() const { return state_ != nullptr; }
  /// True if Get() would not block.
  bool ready() const;

  /// The payload; blocks while pending. REQUIRES: *this is not empty.
  Result<TokenPayload> Get() const;

  /// The ready payload's bytes, or 0 while pending or empty.
  int64_t bytes() const;

  /// Shorthand for Get() when the payload is known to be good. REQUIRES: Get().ok().
  const Payload* operator->() const { return Get().ValueUnsafe().get(); }

  friend bool operator==(const PayloadRef& a, std::nullptr_t) { return !a; }

 private:
  struct State {
    mutable std::mutex mu;
    mutable std::condition_variable cv;
    bool done = false;               // GUARDED_BY(mu)
    Result<TokenPayload> result;     // GUARDED_BY(mu)
  };
  std::shared_ptr<State> state_;
};

}  // namespace braid
