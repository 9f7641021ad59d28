// The image-caption transform (transform.h: image_column + text_column):
//   [BOS] image_token_id x num_patches (each image's), ids(caption) [EOS]
// The image column holds encoded bytes: binary, Hugging Face's Image struct (its bytes
// field), or a list of either.
// loss_mask is 0 on BOS and the placeholders, 1 on the caption and EOS. Apply reads only
// the images' headers (the grids, hence the token count, and header-level skips, the
// same with or without a payload); Finish decodes the pixels (transform/image.h,
// docs/sources.md, "Metadata first").
//
// Thread-safe: Apply and Finish are const and may run on any thread.
#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <arrow/api.h>

#include "braid/transform/image.h"
#include "braid/transform/transform_internal.h"

namespace braid::internal {
namespace {

bool IsBinary(const arrow::DataType& t) {
  return t.id() == arrow::Type::BINARY || t.id() == arrow::Type::LARGE_BINARY ||
         t.id() == arrow::Type::BINARY_VIEW;
}

// Hugging Face `datasets`' Image feature, struct<bytes: binary, path: string> (Parquet
// that `datasets` wrote, save_to_disk folders): the index of its `bytes` field, or -1
// for any other type.
int ImageStructBytes(const arrow::DataType& t) {
  if (t.id() != arrow::Type::STRUCT) return -1;
  const int k = static_cast<const arrow::StructType&>(t).GetFieldIndex("bytes");
  return k >= 0 && IsBinary(*t.field(k)->type()) ? k : -1;
}

// One encoded image a row: a binary column, or an Image struct's bytes.
bool IsEncoded(const arrow::DataType& t) {
  return IsBinary(t) || ImageStructBytes(t) >= 0;
}

// Row `i` of a binary array, or of an Image struct's bytes; false if null (an Image
// struct that holds only a path is null).
bool BinaryAt(const arrow::Array& a, int64_t i, std::string_view* out) {
  if (a.IsNull(i)) return false;
  if (a.type_id() == arrow::Type::STRUCT) {
    // (StructArray::field keeps the child it slices: no allocation per row.)
    const auto& bytes = static_cast<const arrow::StructArray&>(a).field(
        ImageStructBytes(*a.type()));
    return BinaryAt(*bytes, i, out);
  }
  switch (a.type_id()) {
    case arrow::Type::BINARY:
      *out = static_cast<const arrow::BinaryArray&>(a).GetView(i);
      break;
    case arrow::Type::LARGE_BINARY:
      *out = static_cast<const arrow::LargeBinaryArray&>(a).GetView(i);
      break;
    default:
      *out = static_cast<const arrow::BinaryViewArray&>(a).GetView(i);
      break;
  }
  return true;
}

bool IsImageColumn(const arrow::DataType& t) {
  if (IsEncoded(t)) return true;
  const auto id = t.id();
  return (id == arrow::Type::LIST || id == arrow::Type::LARGE_LIST) &&
         IsEncoded(*t.field(0)->type());
}

// Whether the column holds Image structs (alone or in lists).
bool HoldsImageStructs(const arrow::DataType& t) {
  return ImageStructBytes(t) >= 0 ||
         (t.num_fields() == 1 && ImageStructBytes(*t.field(0)->type()) >= 0);
}

// The encoded images of row `i`: one for a binary or Image struct column, each element
// of a list of them in order. False if the row (or an element of its list) is null.
bool ImagesAt(const arrow::Array& a, int64_t i, std::vector<std::string_view>* out) {
  out->clear();
  if (a.IsNull(i)) return false;
  if (IsEncoded(*a.type())) {
    out->emplace_back();
    return BinaryAt(a, i, &out->back());
  }
  int64_t begin = 0, end = 0;
  std::shared_ptr<arrow::Array> values;
  if (a.type_id() == arrow::Type::LIST) {
    const auto& list = static_cast<const arrow::ListArray&>(a);
    begin = list.value_offset(i);
    end = list.value_offset(i + 1);
    values = list.values();
  } else {
    const auto& list = static_cast<const arrow::LargeListArray&>(a);
    begin = list.value_offset(i);
    end = list.value_offset(i + 1);
    values = list.values();
  }
  for (int64_t k = begin; k < end; ++k) {
    out->emplace_back();
    if (!BinaryAt(*values, k, &out->back())) return false;
  }
  return true;
}

class ImageCaptionTransform : public Transform {
 public:
  ImageCaptionTransform(const SourceConfig& s, std::string key,
                        std::shared_ptr<const Tokenizer> tok)
      : image_column_(s.image_column),
        text_column_(s.text_column),
        key_(std::move(key)),
        image_token_id_(static_cast<int32_t>(s.image_token_id)),
        options_{s.image_patch_size, s.image_max_pixels},
        tok_(std::move(tok)) {}

  std::vector<ColumnSpec> columns() const override {
    auto check_binary = [](const arrow::DataType& t) -> std::string {
      return IsImageColumn(t) ? ""
                              : "a binary column (encoded JPEG / PNG / WebP bytes), a "
                                "Hugging Face Image struct (its bytes), or a list of "
                                "either";
    };
    return {{image_column_, key_ + ".image_column", check_binary},
            {text_column_, key_ + ".text_column", CheckString}};
  }

  int64_t EstimateBytes(const Columns& cols, int64_t i) const override {
    std::vector<std::string_view> images;
    ImagesAt(*cols[0], i, &images);
    int64_t bytes = StringBytes(*cols[1], i);
    for (std::string_view image : images) {
      bytes += std::min(int64_t(image.size()) * 64, options_.max_pixels * 12);
    }
    return bytes;
  }

  Status Apply(const Columns& cols, int64_t i, bool want_payload,
               const RowLocation& where, RowOutput* out) const override {
    std::vector<std::string_view> images;
    std::string_view caption;
    if (!ImagesAt(*cols[0], i, &images)) {
      return Null("null column '" + image_column_ + "'" +
                      (HoldsImageStructs(*cols[0]->type())
                           ? " (an Image struct without bytes: images kept as a path "
                             "are not read)"
                           : ""),
                  out);
    }
    if (!StringAt(*cols[1], i, &caption)) {
      return Null("null column '" + text_column_ + "'", out);
    }
    if (images.empty() ||
        std::any_of(images.begin(), images.end(), [](auto im) { return im.empty(); })) {
      out->skip = SkipReason::kEmpty;
      return Status::OK();
    }
    // Metadata first: the headers give the grids, hence the token count; the pixels are
    // decoded by Finish, or never when only metadata is read.
    std::vector<ImageGrid> grids;
    for (size_t k = 0; k < images.size(); ++k) {
      Result<ImageGrid> grid = ReadImageGrid(images[k], options_);
      if (!grid.ok()) {
        // Bad bytes follow on_error like a null: fail naming the row, or a counted skip.
        return Null(grid.status().message() + " (column '" + image_column_ + "'" +
                        (images.size() > 1 ? ", image " + std::to_string(k) : "") + ")",
                    out);
      }
      grids.push_back(*grid);
    }
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
    std::vector<int64_t> starts;
    ids = tok_->prefix();
    int64_t n = 0;  // placeholders of every image, leading the document
    for (const ImageGrid& grid : grids) {
      starts.push_back(static_cast<int64_t>(ids.size()));
      ids.insert(ids.end(), size_t(grid.num_patches()), image_token_id_);
      n += grid.num_patches();
    }
    mask.resize(ids.size(), 0);
    if (!caption.empty()) {
      const Status st = tok_->Encode(caption, &ids);
      if (!st.ok()) return DataError(where.ToString(), st.message());
    }
    ids.insert(ids.end(), tok_->suffix().begin(), tok_->suffix().end());
    mask.resize(ids.size(), 1);
    out->tokens = static_cast<int64_t>(ids.size());
    out->image_tokens = n;
    if (want_payload) {
      auto payload = std::make_shared<Payload>();
      payload->tokens = std::move(ids);
      payload->loss_mask = std::move(mask);
      payload->image_start = std::move(starts);
      for (const ImageGrid& grid : grids) {
        ImagePatches patches;  // pixels: Finish
        patches.grid_h = grid.grid_h;
        patches.grid_w = grid.grid_w;
        payload->images.push_back(std::move(patches));
      }
      out->payload_bytes = payload->bytes() + n * PatchValues() * int64_t{sizeof(float)};
      out->payload = std::move(payload);
      out->deferred = true;
    }
    return Status::OK();
  }

  bool defers() const override { return true; }
  void Cancel() const override { tok_->Cancel(); }

  Status Finish(const Columns& cols, int64_t i, const RowLocation& where,
                Payload* payload) const override {
    std::vector<std::string_view> images;
    ImagesAt(*cols[0], i, &images);  // not null, as many as Apply saw
    for (size_t k = 0; k < payload->images.size(); ++k) {
      ImagePatches& im = payload->images[k];
      Result<ImagePatches> patches =
          DecodeImageAs(images[k], options_, ImageGrid{im.grid_h, im.grid_w});
      if (patches.ok()) {
        im = std::move(*patches);
        continue;
      }
      BlankImagePayload(options_, payload);
      return DataError(where.ToString(), ImageErrorMessage(patches.status(),
                                                           image_column_, k,
                                                           images.size()));
    }
    return Status::OK();
  }

  void EncodedImages(const Columns& cols, int64_t i,
                     std::vector<std::string_view>* out) const override {
    ImagesAt(*cols[0], i, out);
  }

 private:
  static Status Null(const std::string& what, RowOutput* out) {
    out->skip = SkipReason::kNull;
    out->null_what = what;
    return Status::OK();
  }

  const std::string image_column_;
  const std::string text_column_;
  const std::string key_;
  const int32_t image_token_id_;
  int64_t PatchValues() const { return 3 * options_.patch_size * options_.patch_size; }

  const ImageOptions options_;
  const std::shared_ptr<const Tokenizer> tok_;
};

}  // namespace

std::unique_ptr<Transform> MakeImageCaptionTransform(
    const SourceConfig& s, std::string key, std::shared_ptr<const Tokenizer> tok) {
  return std::make_unique<ImageCaptionTransform>(s, std::move(key), std::move(tok));
}

}  // namespace braid::internal
