#include "braid/plan/pack_whole.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <tuple>
#include <vector>

#include "braid/util/rng_internal.h"

namespace braid {
namespace {

// The definition, by scanning every sequence for every piece: pieces longest first
// (ties in `order`), each whole into the smallest room that holds it (the most recently
// changed sequence among equal rooms, sequence 0 first at the start); the rest, in that
// order, into the largest rooms (the same tie rule), cut where a room ends.
std::vector<PackedPart> Reference(const std::vector<int64_t>& lens,
                                  const std::vector<int32_t>& order,
                                  std::vector<int64_t>* rooms) {
  std::vector<int32_t> sorted = order;
  std::stable_sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) {
    return lens[size_t(a)] > lens[size_t(b)];
  });
  // Ties between equal rooms go to the sequence whose room changed last (LIFO lists);
  // at the start, sequence 0.
  std::vector<int64_t> stamp(rooms->size());
  for (size_t s = 0; s < rooms->size(); ++s) stamp[s] = -int64_t(s);
  int64_t clock = 1;
  auto pick = [&](auto better) {
    int64_t best = -1;
    for (size_t s = 0; s < rooms->size(); ++s) {
      if ((*rooms)[s] <= 0) continue;
      if (best < 0 || better((*rooms)[s], (*rooms)[size_t(best)]) ||
          ((*rooms)[s] == (*rooms)[size_t(best)] && stamp[s] > stamp[size_t(best)])) {
        best = int64_t(s);
      }
    }
    return best;
  };
  std::vector<PackedPart> parts;
  std::vector<int32_t> left;
  for (int32_t k : sorted) {
    const int64_t len = lens[size_t(k)];
    int64_t best = -1;
    for (size_t s = 0; s < rooms->size(); ++s) {
      if ((*rooms)[s] < len) continue;
      if (best < 0 || (*rooms)[s] < (*rooms)[size_t(best)] ||
          ((*rooms)[s] == (*rooms)[size_t(best)] && stamp[s] > stamp[size_t(best)])) {
        best = int64_t(s);
      }
    }
    if (best < 0) {
      left.push_back(k);
      continue;
    }
    parts.push_back(PackedPart{k, int32_t(best), 0, len});
    (*rooms)[size_t(best)] -= len;
    stamp[size_t(best)] = clock++;
  }
  for (int32_t k : left) {
    int64_t offset = 0;
    while (offset < lens[size_t(k)]) {
      const int64_t s = pick([](int64_t a, int64_t b) { return a > b; });
      if (s < 0) return parts;  // exceeds the rooms: the packer fails
      const int64_t take = std::min((*rooms)[size_t(s)], lens[size_t(k)] - offset);
      parts.push_back(PackedPart{k, int32_t(s), offset, take});
      (*rooms)[size_t(s)] -= take;
      stamp[size_t(s)] = clock++;
      offset += take;
    }
  }
  return parts;
}

std::tuple<int32_t, int32_t, int64_t, int64_t> Key(const PackedPart& p) {
  return {p.piece, p.sequence, p.offset, p.len};
}

// Pack's output as parts: the whole pieces (in the reference's order: longest first,
// ties in `order`) then the cut ones.
Status PackParts(WholePacker* packer, const std::vector<int64_t>& lens,
                 const std::vector<int32_t>& order, std::vector<int64_t>* rooms,
                 std::vector<PackedPart>* parts) {
  std::vector<int32_t> sequence_of;
  std::vector<PackedPart> cut;
  const Status st = packer->Pack(lens, order, rooms, &sequence_of, &cut);
  if (!st.ok()) return st;
  std::vector<int32_t> sorted = order;
  std::stable_sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) {
    return lens[size_t(a)] > lens[size_t(b)];
  });
  parts->clear();
  for (int32_t k : sorted) {
    if (sequence_of[size_t(k)] >= 0) {
      parts->push_back(PackedPart{k, sequence_of[size_t(k)], 0, lens[size_t(k)]});
    }
  }
  parts->insert(parts->end(), cut.begin(), cut.end());
  return Status::OK();
}

struct Instance {
  std::vector<int64_t> lens;
  std::vector<int32_t> order;
  std::vector<int64_t> rooms;
};

// Random pieces that fill `sequences` rooms of `fill` exactly (less `padding` tokens):
// long-tail lengths, some equal ones, some rooms already partly used.
Instance RandomInstance(uint64_t seed, size_t sequences, int64_t fill, int64_t padding) {
  internal::Rng rng(seed);
  Instance in;
  in.rooms.assign(sequences, fill);
  for (auto& r : in.rooms) {
    if (rng.Below(4) == 0) r -= int64_t(rng.Below(uint64_t(fill / 2)));
  }
  int64_t total = std::accumulate(in.rooms.begin(), in.rooms.end(), int64_t{0}) - padding;
  while (total > 0) {
    int64_t len = rng.Below(3) == 0 ? int64_t(1 + rng.Below(uint64_t(fill)))
                                    : int64_t(1 + rng.Below(uint64_t(fill / 8 + 1)));
    if (rng.Below(10) == 0) len = fill / 4;  // ties
    len = std::min(len, total);
    in.lens.push_back(len);
    total -= len;
  }
  in.order.resize(in.lens.size());
  std::iota(in.order.begin(), in.order.end(), 0);
  rng.Shuffle(&in.order);
  return in;
}

TEST(WholePackerTest, EqualsTheDefinitionAndCoversEveryTokenOnce) {
  WholePacker packer;  // one packer for every instance: its scratch is reused
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    const size_t sequences = 1 + size_t(seed % 17);
    const int64_t fill = seed % 3 == 0 ? 4096 : 100 + int64_t(seed);
    const int64_t padding = seed % 5 == 0 ? fill / 3 : 0;
    Instance in = RandomInstance(seed, sequences, fill, padding);
    std::vector<int64_t> rooms = in.rooms, reference_rooms = in.rooms;
    std::vector<PackedPart> parts;
    ASSERT_TRUE(PackParts(&packer, in.lens, in.order, &rooms, &parts).ok()) << seed;
    const auto want = Reference(in.lens, in.order, &reference_rooms);
    ASSERT_EQ(parts.size(), want.size()) << seed;
    for (size_t i = 0; i < parts.size(); ++i) {
      EXPECT_EQ(Key(parts[i]), Key(want[i])) << "seed " << seed << " part " << i;
    }
    EXPECT_EQ(rooms, reference_rooms);
    // Every piece's tokens once, in order of offset; no room overfilled.
    std::vector<int64_t> covered(in.lens.size(), 0), used(sequences, 0);
    for (const PackedPart& p : parts) {
      EXPECT_EQ(p.offset, covered[size_t(p.piece)]);
      EXPECT_GT(p.len, 0);
      covered[size_t(p.piece)] += p.len;
      used[size_t(p.sequence)] += p.len;
    }
    EXPECT_EQ(covered, in.lens);
    for (size_t s = 0; s < sequences; ++s) {
      EXPECT_EQ(used[s] + rooms[s], in.rooms[s]);
      EXPECT_GE(rooms[s], 0);
    }
    if (padding == 0) {
      for (int64_t r : rooms) EXPECT_EQ(r, 0) << "pieces that fill the rooms fill all";
    }
  }
}

// A piece is cut only when, at its turn, no room held it whole; and a cut piece fills
// every room it enters but its last.
TEST(WholePackerTest, CutsOnlyWhatNoRoomHoldsAndOnlyWhereARoomEnds) {
  WholePacker packer;
  int64_t cut = 0, whole = 0;
  for (uint64_t seed = 100; seed < 140; ++seed) {
    Instance in = RandomInstance(seed, 32, 4096, 0);
    std::vector<int64_t> rooms = in.rooms;
    std::vector<PackedPart> parts;
    ASSERT_TRUE(PackParts(&packer, in.lens, in.order, &rooms, &parts).ok());
    std::vector<int> count(in.lens.size(), 0);
    for (const PackedPart& p : parts) ++count[size_t(p.piece)];
    // Replay the rooms to see each cut part end its room.
    std::vector<int64_t> room = in.rooms;
    for (const PackedPart& p : parts) {
      room[size_t(p.sequence)] -= p.len;
      if (count[size_t(p.piece)] > 1 && p.offset + p.len < in.lens[size_t(p.piece)]) {
        EXPECT_EQ(room[size_t(p.sequence)], 0) << "a cut inside a room, seed " << seed;
      }
    }
    for (int c : count) (c == 1 ? whole : cut) += 1;
  }
  // Best fit decreasing on long-tail pieces: nearly everything whole.
  EXPECT_GT(whole, 20 * cut);
}

// `first` orders the sequences at the start: equal rooms are filled in its order.
TEST(WholePackerTest, TheFirstOrderChoosesWhichSequencesFillFirst) {
  WholePacker packer;
  std::vector<int64_t> rooms(4, 10);
  std::vector<int32_t> sequence_of;
  std::vector<PackedPart> cut;
  const std::vector<int32_t> first = {2, 0, 3, 1};
  ASSERT_TRUE(
      packer.Pack({10, 10, 6, 6}, {0, 1, 2, 3}, &rooms, &sequence_of, &cut, &first).ok());
  // Longest first: 10 -> 2, 10 -> 0, 6 -> 3, then the other 6 best fits nowhere
  // smaller than the untouched 10 of sequence 1 (the 4 left in 3 is too small).
  EXPECT_EQ(sequence_of, (std::vector<int32_t>{2, 0, 3, 1}));
  EXPECT_TRUE(cut.empty());
  EXPECT_EQ(rooms, (std::vector<int64_t>{0, 4, 0, 4}));
  std::vector<int32_t> wrong = {0, 1};
  EXPECT_TRUE(packer.Pack({1}, {0}, &rooms, &sequence_of, &cut, &wrong).IsInvalid());
}

TEST(WholePackerTest, PiecesBeyondTheRoomsAreABugNotACrash) {
  WholePacker packer;
  std::vector<int64_t> rooms = {10, 10};
  std::vector<PackedPart> parts;
  EXPECT_TRUE(PackParts(&packer, {8, 8, 8}, {0, 1, 2}, &rooms, &parts).IsInvalid());
  // An order shorter than the pieces.
  EXPECT_TRUE(PackParts(&packer, {1, 2}, {0}, &rooms, &parts).IsInvalid());
}

}  // namespace
}  // namespace braid
