#include "braid/service/wire.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "braid/transform/image.h"

namespace braid {
namespace {

Status Malformed(const std::string& what) {
  return DataError("plan message", "malformed: " + what);
}

// Reads values from a message, failing past its end.
class Reader {
 public:
  Reader(const int64_t* data, size_t size, size_t at) : data_(data), size_(size), at_(at) {}
  Result<int64_t> Next(const char* what) {
    if (at_ >= size_) return Malformed(std::string("ends before ") + what);
    return data_[at_++];
  }
  Result<int64_t> Count(const char* what) {
    ARROW_ASSIGN_OR_RAISE(int64_t n, Next(what));
    if (n < 0 || static_cast<size_t>(n) > size_ - at_ + 1) {
      return Malformed(std::string("bad count of ") + what);
    }
    return n;
  }

 private:
  const int64_t* data_;
  size_t size_;
  size_t at_;
};

}  // namespace

std::vector<int64_t> EncodeStepPlan(const StepPlan& plan) {
  const int64_t buckets = static_cast<int64_t>(plan.buckets.size());
  std::vector<int64_t> out = {plan.step, plan.seq_len, buckets, buckets};
  for (int64_t b = 0; b < buckets; ++b) out.push_back(b);
  const size_t offsets_at = out.size();
  out.resize(out.size() + size_t(buckets) + 1);
  for (int64_t b = 0; b < buckets; ++b) {
    out[offsets_at + size_t(b)] = static_cast<int64_t>(out.size());
    const BucketPlan& rank = plan.buckets[size_t(b)];
    out.push_back(static_cast<int64_t>(rank.micro_batches.size()));
    for (const MicroBatch& mb : rank.micro_batches) {
      out.push_back(static_cast<int64_t>(mb.sequences.size()));
      for (const Sequence& seq : mb.sequences) {
        out.push_back(static_cast<int64_t>(seq.docs.size()));
        for (const DocPiece& d : seq.docs) {
          out.insert(out.end(), {d.source, d.file, d.row, d.epoch, d.start, d.len,
                                 d.doc_tokens, d.image_tokens});
        }
      }
    }
  }
  out[offsets_at + size_t(buckets)] = static_cast<int64_t>(out.size());
  return out;
}

namespace {

// The header of an encoded plan, checked: held buckets ascending and in range, section
// offsets ascending and inside the message.
struct Header {
  int64_t step = 0;
  int64_t buckets = 0;
  int64_t held = 0;
  const int64_t* ids = nullptr;      // held bucket numbers
  const int64_t* offsets = nullptr;  // held + 1
  size_t size = 0;                   // words of the header
};

Result<Header> ReadHeader(const int64_t* data, size_t size) {
  if (size < 4 || data[2] < 0 || data[3] < 0 || data[3] > data[2] ||
      size < 4 + 2 * size_t(data[3]) + 1) {
    return Malformed("no header");
  }
  Header h;
  h.step = data[0];
  h.buckets = data[2];
  h.held = data[3];
  h.ids = data + 4;
  h.offsets = data + 4 + h.held;
  h.size = 4 + 2 * size_t(h.held) + 1;
  for (int64_t k = 0; k < h.held; ++k) {
    if (h.ids[k] < 0 || h.ids[k] >= h.buckets || (k > 0 && h.ids[k] <= h.ids[k - 1])) {
      return Malformed("bad bucket numbers");
    }
  }
  for (int64_t k = 0; k <= h.held; ++k) {
    const int64_t at = h.offsets[k];
    if (at < int64_t(h.size) || at > int64_t(size) || (k > 0 && at < h.offsets[k - 1])) {
      return Malformed("bad bucket offsets");
    }
  }
  return h;
}

}  // namespace

Result<std::pair<int64_t, int64_t>> EncodedStepAndBuckets(const int64_t* data,
                                                          size_t size) {
  ARROW_ASSIGN_OR_RAISE(Header h, ReadHeader(data, size));
  return std::make_pair(h.step, h.buckets);
}

Result<std::vector<int64_t>> SliceStepPlan(const int64_t* data, size_t size,
                                           const std::vector<int64_t>& buckets) {
  ARROW_ASSIGN_OR_RAISE(Header h, ReadHeader(data, size));
  std::vector<int64_t> wanted = buckets;
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  std::vector<int64_t> at;  // index of each wanted bucket among the held ones
  for (const int64_t b : wanted) {
    const int64_t* found = std::lower_bound(h.ids, h.ids + h.held, b);
    if (found == h.ids + h.held || *found != b) {
      return Malformed("no bucket " + std::to_string(b) + " (it holds " +
                       std::to_string(h.held) + " of " + std::to_string(h.buckets) + ")");
    }
    at.push_back(found - h.ids);
  }
  const int64_t held = static_cast<int64_t>(wanted.size());
  std::vector<int64_t> out = {data[0], data[1], h.buckets, held};
  out.insert(out.end(), wanted.begin(), wanted.end());
  const size_t offsets_at = out.size();
  out.resize(out.size() + size_t(held) + 1);
  for (int64_t k = 0; k < held; ++k) {
    out[offsets_at + size_t(k)] = static_cast<int64_t>(out.size());
    out.insert(out.end(), data + h.offsets[at[size_t(k)]],
               data + h.offsets[at[size_t(k)] + 1]);
  }
  out[offsets_at + size_t(held)] = static_cast<int64_t>(out.size());
  return out;
}

Result<StepPlan> DecodeBucket(const int64_t* data, size_t size, int64_t bucket) {
  ARROW_ASSIGN_OR_RAISE(Header h, ReadHeader(data, size));
  if (bucket < 0 || bucket >= h.buckets) {
    return Malformed("no bucket " + std::to_string(bucket) + " (it holds " +
                     std::to_string(h.buckets) + ")");
  }
  const int64_t* found = std::lower_bound(h.ids, h.ids + h.held, bucket);
  if (found == h.ids + h.held || *found != bucket) {
    return Malformed("bucket " + std::to_string(bucket) + " is not in this slice");
  }
  const int64_t at = h.offsets[found - h.ids];
  if (static_cast<size_t>(at) >= size) return Malformed("bad bucket offset");
  StepPlan plan;
  plan.step = data[0];
  plan.seq_len = data[1];
  plan.buckets.resize(size_t(bucket) + 1);
  BucketPlan& rank = plan.buckets[size_t(bucket)];
  rank.bucket = bucket;
  Reader in(data, size, size_t(at));
  ARROW_ASSIGN_OR_RAISE(int64_t micro_batches, in.Count("micro-batches"));
  rank.micro_batches.resize(size_t(micro_batches));
  for (MicroBatch& mb : rank.micro_batches) {
    ARROW_ASSIGN_OR_RAISE(int64_t sequences, in.Count("sequences"));
    mb.sequences.resize(size_t(sequences));
    for (Sequence& seq : mb.sequences) {
      ARROW_ASSIGN_OR_RAISE(int64_t pieces, in.Count("pieces"));
      seq.docs.resize(size_t(pieces));
      for (DocPiece& d : seq.docs) {
        int64_t f[kPieceFields];
        for (int64_t& v : f) {
          ARROW_ASSIGN_OR_RAISE(v, in.Next("a piece"));
        }
        d.source = static_cast<int32_t>(f[0]);
        d.file = static_cast<int32_t>(f[1]);
        d.row = f[2];
        d.epoch = f[3];
        d.start = f[4];
        d.len = f[5];
        d.doc_tokens = f[6];
        d.image_tokens = f[7];
        if (d.len < 0 || d.start < 0 || d.start + d.len > d.doc_tokens) {
          return Malformed("a piece outside its document");
        }
        seq.tokens += d.len;
        mb.tokens += d.len;
        rank.tokens += d.len;
      }
    }
  }
  return plan;
}

std::vector<std::vector<int64_t>> PieceRequests(const StepPlan& plan, int64_t bucket,
                                                int32_t num_sources) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(num_sources));
  for (const MicroBatch& mb : plan.buckets[size_t(bucket)].micro_batches) {
    for (const Sequence& seq : mb.sequences) {
      for (const DocPiece& d : seq.docs) {
        if (d.source < 0 || d.source >= num_sources) continue;
        out[size_t(d.source)].insert(out[size_t(d.source)].end(),
                                     {d.file, d.row, d.start, d.len, d.doc_tokens});
      }
    }
  }
  return out;
}

namespace {

// The '\0'-terminated strings of `blob`.
std::vector<std::string> SplitPaths(const std::vector<uint8_t>& blob) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t i = 0; i < blob.size(); ++i) {
    if (blob[i] != 0) continue;
    out.emplace_back(reinterpret_cast<const char*>(blob.data()) + begin, i - begin);
    begin = i + 1;
  }
  return out;
}

}  // namespace

Status AttachPieces(StepPlan* plan, int64_t bucket, int32_t source,
                    const SourceConfig& source_config,
                    std::shared_ptr<const PieceReply> reply,
                    std::vector<std::string>* blanked, int64_t pad_to_multiple_of) {
  const std::string where = "step " + std::to_string(plan->step) + ": sources[" +
                            std::to_string(source) + "] reply";
  const bool masked = !reply->loss_mask.empty();
  if (masked && reply->loss_mask.size() != reply->tokens.size()) {
    return DataError(where, "loss mask and tokens differ in length");
  }
  if (reply->images.size() % size_t(kImageFields) != 0) {
    return DataError(where, "image fields are not a multiple of " +
                                std::to_string(kImageFields));
  }
  const std::vector<std::string> paths = SplitPaths(reply->paths);
  const ImageOptions options{source_config.image_patch_size, source_config.image_max_pixels};
  size_t next_image = 0;  // in reply->images, by piece order
  int64_t next_byte = 0;
  size_t k = 0;
  for (MicroBatch& mb : plan->buckets[size_t(bucket)].micro_batches) {
    for (Sequence& seq : mb.sequences) {
      for (DocPiece& d : seq.docs) {
        if (d.source != source) continue;
        if (k + 1 >= reply->offsets.size()) {
          return DataError(where, "holds fewer pieces than requested");
        }
        const int64_t begin = reply->offsets[k];
        const int64_t end = reply->offsets[k + 1];
        ++k;
        const int64_t want = std::min(d.start + d.len + 1, d.doc_tokens) - d.start;
        // Padding (pad_to_multiple_of > 1): the row may end up to m-1 tokens before the
        // planned document does; every piece still holds a token of it.
        const int64_t least = std::max<int64_t>(1, want - (pad_to_multiple_of - 1));
        if (begin < 0 || end < begin || end - begin > want || end - begin < least ||
            static_cast<size_t>(end) > reply->tokens.size()) {
          return DataError(where, "piece " + std::to_string(k - 1) + " has " +
                                      std::to_string(end - begin) + " tokens, expected " +
                                      std::to_string(want));
        }
        auto payload = std::make_shared<Payload>();
        payload->tokens =
            TokenSpan::View(reply->tokens.data() + begin, size_t(end - begin), reply);
        if (masked) {
          payload->loss_mask.assign(reply->loss_mask.begin() + begin,
                                    reply->loss_mask.begin() + end);
        }
        Status bad;  // the first of the row's images that does not decode
        for (; next_image < reply->images.size() &&
               reply->images[next_image] == int64_t(k - 1);
             next_image += size_t(kImageFields)) {
          const int64_t* f = reply->images.data() + next_image;
          const ImageGrid grid{static_cast<int32_t>(f[2]), static_cast<int32_t>(f[3])};
          if (f[1] < -1 || f[2] < 0 || f[3] < 0 || f[4] < 0 || f[5] < 0 ||
              size_t(f[5]) >= paths.size() || f[6] < 0 || f[6] >= f[7] ||
              (f[1] >= 0 && f[1] + grid.num_patches() > want) ||
              next_byte + f[4] > static_cast<int64_t>(reply->image_bytes.size())) {
            return DataError(where, "piece " + std::to_string(k - 1) +
                                        ": an image outside its tokens or bytes");
          }
          const std::string_view bytes(
              reinterpret_cast<const char*>(reply->image_bytes.data()) + next_byte,
              size_t(f[4]));
          next_byte += f[4];
          ImagePatches image;
          image.grid_h = grid.grid_h;
          image.grid_w = grid.grid_w;
          if (bad.ok()) {
            Result<ImagePatches> decoded = DecodeImageAs(bytes, options, grid);
            if (decoded.ok()) {
              image = std::move(*decoded);
            } else {
              bad = DataError(DataLocation(paths[size_t(f[5])], -1, d.row),
                              ImageErrorMessage(decoded.status(), source_config.image_column,
                                                size_t(f[6]), size_t(f[7])));
            }
          }
          if (f[1] < 0) continue;  // another piece's image: only checked
          payload->image_start.push_back(f[1]);
          payload->images.push_back(std::move(image));
        }
        if (!bad.ok()) {
          if (source_config.on_error != OnError::kSkip) {
            return WithSkipHint(bad, "such rows");
          }
          // As the source loader delivers such a row: blank images, nothing trained.
          BlankImagePayload(options, payload.get());
          if (blanked != nullptr) blanked->push_back(bad.message());
        }
        d.payload = PayloadRef(TokenPayload(std::move(payload)));
        d.doc_tokens = want;  // the planned window: the constructor pads what is missing
        d.start = 0;
      }
    }
  }
  if (k + 1 != reply->offsets.size()) {
    return DataError(where, "holds more pieces than requested");
  }
  if (next_image != reply->images.size() ||
      next_byte != static_cast<int64_t>(reply->image_bytes.size())) {
    return DataError(where, "holds images of no requested piece");
  }
  return Status::OK();
}

}  // namespace braid
