#include "braid/source/payload.h"

namespace braid {

PayloadRef PayloadRef::OnDemand(Producer produce) {
  PayloadRef ref;
  ref.state_ = std::make_shared<State>();
  ref.state_->produce = std::move(produce);
  return ref;
}

void PayloadRef::Start(bool urgent) const {
  if (!state_) return;
  Producer produce;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->done || !state_->produce) return;
    produce = std::exchange(state_->produce, nullptr);
  }
  produce(*this, urgent);
}

void PayloadRef::Set(Result<TokenPayload> result) const {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->done) return;
    state_->result = std::move(result);
    state_->done = true;
    state_->produce = nullptr;
  }
  state_->cv.notify_all();
}

bool PayloadRef::ready() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

Result<TokenPayload> PayloadRef::Get() const {
  if (ready_ != nullptr) return ready_;
  Start(/*urgent=*/true);
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [this] { return state_->done; });
  return state_->result;
}

int64_t PayloadRef::bytes() const {
  if (ready_ != nullptr) return ready_->bytes();
  if (!state_) return 0;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->done || !state_->result.ok()) return 0;
  return (*state_->result)->bytes();
}

}  // namespace braid
