#include "braid/plan/pack_whole.h"

#include <algorithm>
#include <bit>
#include <utility>

namespace braid {

void WholePacker::Reset(int64_t max_room, size_t sequences) {
  const size_t sizes = size_t(max_room) + 1;
  head_.assign(sizes, -1);
  next_.assign(sequences, -1);
  words_.assign((sizes + 63) / 64, 0);
  summary_.assign((words_.size() + 63) / 64, 0);
}

void WholePacker::Push(int32_t sequence, int64_t room) {
  const size_t r = size_t(room);
  next_[size_t(sequence)] = head_[r];
  head_[r] = sequence;
  words_[r / 64] |= uint64_t{1} << (r % 64);
  summary_[r / 4096] |= uint64_t{1} << ((r / 64) % 64);
}

int32_t WholePacker::Pop(int64_t room) {
  const size_t r = size_t(room);
  const int32_t s = head_[r];
  head_[r] = next_[size_t(s)];
  if (head_[r] < 0) {
    words_[r / 64] &= ~(uint64_t{1} << (r % 64));
    if (words_[r / 64] == 0) summary_[r / 4096] &= ~(uint64_t{1} << ((r / 64) % 64));
  }
  return s;
}

int64_t WholePacker::SmallestAtLeast(int64_t len) const {
  size_t r = size_t(len);
  if (r / 64 >= words_.size()) return -1;
  const uint64_t here = words_[r / 64] & (~uint64_t{0} << (r % 64));
  if (here != 0) return int64_t(r / 64 * 64 + size_t(std::countr_zero(here)));
  // The next non-empty word after r's, through the summary.
  size_t w = r / 64 + 1;
  if (w / 64 >= summary_.size()) return -1;
  uint64_t bits = summary_[w / 64] & (~uint64_t{0} << (w % 64));
  size_t block = w / 64;
  while (bits == 0) {
    if (++block >= summary_.size()) return -1;
    bits = summary_[block];
  }
  const size_t word = block * 64 + size_t(std::countr_zero(bits));
  return int64_t(word * 64 + size_t(std::countr_zero(words_[word])));
}

int64_t WholePacker::Largest() const {
  for (size_t block = summary_.size(); block-- > 0;) {
    if (summary_[block] == 0) continue;
    const size_t word = block * 64 + 63 - size_t(std::countl_zero(summary_[block]));
    return int64_t(word * 64 + 63 - size_t(std::countl_zero(words_[word])));
  }
  return -1;
}

Status WholePacker::Pack(const std::vector<int64_t>& lens,
                         const std::vector<int32_t>& order, std::vector<int64_t>* rooms,
                         std::vector<int32_t>* sequence_of,
                         std::vector<PackedPart>* cut,
                         const std::vector<int32_t>* first) {
  cut->clear();
  const size_t n = lens.size();
  if (order.size() != n) {
    return Status::Invalid("WholePacker: ", n, " pieces but an order of ", order.size(),
                           " (a bug)");
  }
  sequence_of->assign(n, -1);
  int64_t max_len = 0, max_room = 0;
  for (int64_t len : lens) max_len = std::max(max_len, len);
  for (int64_t room : *rooms) max_room = std::max(max_room, room);
  // The pieces longest first, equal lengths in `order`: a counting sort when the lengths
  // are few against the pieces, else a stable sort.
  sorted_.resize(n);
  if (max_len <= int64_t(4 * n) + 4096) {
    count_.assign(size_t(max_len) + 2, 0);
    for (int64_t len : lens) ++count_[size_t(max_len - len)];
    int32_t sum = 0;
    for (int32_t& c : count_) sum += std::exchange(c, sum);
    for (int32_t k : order) {
      sorted_[size_t(count_[size_t(max_len - lens[size_t(k)])]++)] = k;
    }
  } else {
    sorted_ = order;
    std::stable_sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) {
      return lens[size_t(a)] > lens[size_t(b)];
    });
  }
  Reset(max_room, rooms->size());
  if (first != nullptr && first->size() != rooms->size()) {
    return Status::Invalid("WholePacker: ", rooms->size(), " rooms but an order of ",
                           first->size(), " sequences (a bug)");
  }
  for (size_t j = rooms->size(); j-- > 0;) {  // LIFO: the first pushed last
    const size_t s = first != nullptr ? size_t((*first)[j]) : j;
    if ((*rooms)[s] > 0) Push(static_cast<int32_t>(s), (*rooms)[s]);
  }
  leftover_.clear();
  int32_t* whole = sequence_of->data();
  int64_t* room_of = rooms->data();
  for (int32_t k : sorted_) {
    const int64_t len = lens[size_t(k)];
    const int64_t room = SmallestAtLeast(len);
    if (room < 0) {
      leftover_.push_back(k);
      continue;
    }
    const int32_t s = Pop(room);
    whole[k] = s;
    room_of[s] = room - len;
    if (room > len) Push(s, room - len);
  }
  for (int32_t k : leftover_) {
    const int64_t len = lens[size_t(k)];
    int64_t offset = 0;
    while (offset < len) {
      const int64_t room = Largest();
      if (room < 0) {
        return Status::Invalid("WholePacker: ", len - offset, " tokens of piece ", k,
                               " exceed the rooms (a bug)");
      }
      const int32_t s = Pop(room);
      const int64_t take = std::min(room, len - offset);
      cut->push_back(PackedPart{k, s, offset, take});
      offset += take;
      room_of[s] = room - take;
      if (room > take) Push(s, room - take);
    }
  }
  return Status::OK();
}

}  // namespace braid
