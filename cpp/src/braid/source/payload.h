// Sample payloads and the handle that lets metadata run ahead of them.
//
// A source loader publishes a sample's metadata as soon as it knows it, and its payload
// (tokens, loss mask, decoded images) when the transform has finished. PayloadRef is the
// shared handle between the two: the planner passes it along without looking; the
// constructor calls Get(), which blocks until the payload is ready. A payload whose work
// is deferred (image decoding) is produced on demand: its work starts when someone first
// wants it (Want(), once a step that uses it is planned for this process, or Get()), so
// a process decodes only the images of the micro-batches it builds. Thread-safe.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "braid/status.h"

namespace braid {

/// One decoded image cut into patches (transform/image.h): `pixels` holds
/// grid_h * grid_w patches in row-major grid order, each 3 * p * p floats, channel-first
/// within the patch ([c][y][x]). Its grid_h * grid_w placeholder tokens are in `tokens`.
struct ImagePatches {
  int32_t grid_h = 0;
  int32_t grid_w = 0;
  std::vector<float> pixels;

  int64_t num_patches() const { return int64_t{grid_h} * grid_w; }
};

/// A sample's token ids, read-only: either owned, or a view into a buffer that `owner`
/// keeps alive (e.g. the values of an Arrow list<int32> column, shared by every row of a
/// row group, so a token column is passed through without a copy). Transforms build ids
/// in a std::vector and move it in. Copying an owned span copies the ids; copying a view
/// shares the buffer. Thread-compatible (immutable once built).
class TokenSpan {
 public:
  using value_type = int32_t;
  using const_iterator = const int32_t*;
  using iterator = const_iterator;

  TokenSpan() = default;
  TokenSpan(std::vector<int32_t> ids) : owned_(std::move(ids)) {}  // NOLINT: implicit
  TokenSpan(std::initializer_list<int32_t> ids) : owned_(ids) {}
  TokenSpan(const TokenSpan& other) { *this = other; }
  TokenSpan(TokenSpan&& other) noexcept { *this = std::move(other); }
  TokenSpan& operator=(const TokenSpan& other) {
    if (this != &other) {
      owned_ = other.owned_;
      owner_ = other.owner_;
      view_ = other.view_;
      view_size_ = other.view_size_;
    }
    return *this;
  }
  TokenSpan& operator=(TokenSpan&& other) noexcept {
    if (this == &other) return *this;
    owned_ = std::move(other.owned_);
    owner_ = std::move(other.owner_);
    view_ = std::exchange(other.view_, nullptr);
    view_size_ = std::exchange(other.view_size_, 0);
    other.owned_.clear();
    return *this;
  }

  /// A view of `size` ids at `data`. REQUIRES: `owner` keeps [data, data + size) alive and
  /// unchanged for as long as any copy of the span exists.
  static TokenSpan View(const int32_t* data, size_t size,
                        std::shared_ptr<const void> owner) {
    TokenSpan s;
    s.view_ = data;
    s.view_size_ = size;
    s.owner_ = std::move(owner);
    return s;
  }

  const int32_t* data() const { return view_ != nullptr ? view_ : owned_.data(); }
  size_t size() const { return view_ != nullptr ? view_size_ : owned_.size(); }
  bool empty() const { return size() == 0; }
  const int32_t* begin() const { return data(); }
  const int32_t* end() const { return data() + size(); }
  int32_t operator[](size_t i) const { return data()[i]; }
  /// True if the ids live in a shared buffer (not copied).
  bool is_view() const { return view_ != nullptr; }

  friend bool operator==(const TokenSpan& a, const TokenSpan& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const TokenSpan& a, const std::vector<int32_t>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  std::vector<int32_t> owned_;         // the ids, unless view_ is set
  std::shared_ptr<const void> owner_;  // keeps view_ alive
  const int32_t* view_ = nullptr;
  size_t view_size_ = 0;
};

/// What a constructor needs of a sample: its tokens and, where the transform says which
/// tokens are targets (chat data), a per-token loss mask.
struct Payload {
  TokenSpan tokens;
  /// Empty: every token is a target. Else one 0/1 per token: 1 where predicting that
  /// token is trained (e.g. response tokens of a chat).
  std::vector<uint8_t> loss_mask;
  /// Images of an image-caption sample, in token order. INVARIANT: image k's placeholders
  /// are the tokens [image_start[k], image_start[k] + images[k].num_patches()).
  std::vector<ImagePatches> images;
  std::vector<int64_t> image_start;

  /// Bytes held, for read-ahead accounting. A view of a shared buffer counts its own
  /// slice (the rest belongs to the other rows of that buffer).
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
/// A ready payload is held directly (no lock, no extra allocation); only a pending one
/// has the shared state that Set() completes.
class PayloadRef {
 public:
  /// No payload.
  PayloadRef() = default;
  /// A ready payload (null: no payload).
  PayloadRef(TokenPayload ready)  // NOLINT: implicit, a ready payload is a PayloadRef
      : ready_(std::move(ready)) {}

  /// Produces an on-demand payload: must complete `ref` with Set(), at once or from work
  /// it hands to another thread. `urgent`: the caller waits for it (Get()). Must not
  /// call back into `ref` other than Set().
  using Producer = std::function<void(const PayloadRef& ref, bool urgent)>;

  /// A payload produced on demand: `produce` runs once, on the thread that first calls
  /// Want() or Get() (outside any lock of the handle). Until then nothing is done, and a
  /// handle that nobody wants frees `produce` with its last copy.
  static PayloadRef OnDemand(Producer produce);

  /// Completes a pending payload (once; later calls are ignored); wakes every waiter.
  /// REQUIRES: made by OnDemand().
  void Set(Result<TokenPayload> result) const;

  /// Starts producing an on-demand payload that has not started (a hint that it will be
  /// needed soon); does nothing to any other.
  void Want() const { Start(/*urgent=*/false); }

  /// True if a payload exists, ready or pending.
  explicit operator bool() const { return ready_ != nullptr || state_ != nullptr; }
  /// True if the payload is complete (Get() returns at once).
  bool ready() const;

  /// The payload; starts it if on demand and blocks while pending. REQUIRES: *this is
  /// not empty.
  Result<TokenPayload> Get() const;

  /// The ready payload's bytes, or 0 while pending, failed or empty.
  int64_t bytes() const;

  /// Shorthand for Get() when the payload is known to be good. REQUIRES: Get().ok().
  const Payload* operator->() const {
    return ready_ != nullptr ? ready_.get() : Get().ValueUnsafe().get();
  }

  friend bool operator==(const PayloadRef& a, std::nullptr_t) { return !a; }

 private:
  struct State {
    mutable std::mutex mu;
    mutable std::condition_variable cv;
    bool done = false;               // GUARDED_BY(mu)
    Result<TokenPayload> result;     // GUARDED_BY(mu)
    Producer produce;                // GUARDED_BY(mu) set until it is started
  };
  // Runs the producer if it is set (once).
  void Start(bool urgent) const;
  TokenPayload ready_;             // INVARIANT: at most one of ready_ and state_ is set
  std::shared_ptr<State> state_;
};

}  // namespace braid
