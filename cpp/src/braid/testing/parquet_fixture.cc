#include "braid/testing/parquet_fixture.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/writer.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>

#include "braid/transform/image.h"
#include "braid/util/rng_internal.h"

namespace braid::testing {

namespace {

template <typename ValueBuilder>
Result<std::shared_ptr<arrow::Array>> BuildList(
    const std::vector<std::vector<int32_t>>& docs, const std::vector<int64_t>& null_rows,
    bool required = false) {
  auto values = std::make_shared<ValueBuilder>();
  auto type = arrow::list(arrow::field("element", values->type(), !required));
  arrow::ListBuilder list(arrow::default_memory_pool(), values, type);
  for (size_t i = 0; i < docs.size(); ++i) {
    if (std::find(null_rows.begin(), null_rows.end(), int64_t(i)) != null_rows.end()) {
      ARROW_RETURN_NOT_OK(list.AppendNull());
      continue;
    }
    ARROW_RETURN_NOT_OK(list.Append());
    for (int32_t t : docs[i]) ARROW_RETURN_NOT_OK(values->Append(t));
  }
  return list.Finish();
}

}  // namespace

Status WriteTokenFile(const std::string& path, const std::vector<std::vector<int32_t>>& docs,
                      const TokenFileOptions& options) {
  std::shared_ptr<arrow::Array> array;
  if (options.int64_values) {
    ARROW_ASSIGN_OR_RAISE(array, BuildList<arrow::Int64Builder>(docs, options.null_rows,
                                                                options.required));
  } else {
    ARROW_ASSIGN_OR_RAISE(array, BuildList<arrow::Int32Builder>(docs, options.null_rows,
                                                                options.required));
  }
  std::vector<std::shared_ptr<arrow::Field>> fields = {
      arrow::field(options.column, array->type(), !options.required)};
  std::vector<std::shared_ptr<arrow::Array>> arrays = {array};
  if (!options.length_column.empty()) {
    arrow::Int64Builder lengths;
    for (size_t i = 0; i < docs.size(); ++i) {
      std::optional<int64_t> n = int64_t(docs[i].size());
      if (std::find(options.null_rows.begin(), options.null_rows.end(), int64_t(i)) !=
          options.null_rows.end()) {
        n.reset();
      }
      for (const auto& [row, value] : options.length_overrides) {
        if (row == int64_t(i)) n = value;
      }
      ARROW_RETURN_NOT_OK(n ? lengths.Append(*n) : lengths.AppendNull());
    }
    ARROW_ASSIGN_OR_RAISE(auto length_array, lengths.Finish());
    fields.push_back(arrow::field(options.length_column, arrow::int64()));
    arrays.push_back(length_array);
  }
  auto table = arrow::Table::Make(arrow::schema(fields), arrays);
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  parquet::WriterProperties::Builder props;
  if (options.data_page_v2) props.data_page_version(parquet::ParquetDataPageVersion::V2);
  if (options.data_page_bytes > 0) {  // checked once per write batch: small batches too
    props.data_pagesize(options.data_page_bytes);
    props.write_batch_size(16);
  }
  props.compression(options.compression == "zstd"     ? arrow::Compression::ZSTD
                    : options.compression == "snappy" ? arrow::Compression::SNAPPY
                                                      : arrow::Compression::UNCOMPRESSED);
  ARROW_ASSIGN_OR_RAISE(auto out, arrow::io::FileOutputStream::Open(path));
  ARROW_RETURN_NOT_OK(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out,
                                                 options.row_group_rows, props.build()));
  return out->Close();
}

Status CorruptRowGroup(const std::string& path, int row_group, int column) {
  std::vector<std::pair<int64_t, int64_t>> ranges;  // (offset, bytes) per column chunk
  try {
    auto reader = parquet::ParquetFileReader::OpenFile(path);
    auto rg = reader->metadata()->RowGroup(row_group);
    for (int c = 0; c < rg->num_columns(); ++c) {
      if (column >= 0 && c != column) continue;
      auto chunk = rg->ColumnChunk(c);
      const int64_t start = chunk->has_dictionary_page()
                                ? std::min(chunk->dictionary_page_offset(),
                                           chunk->data_page_offset())
                                : chunk->data_page_offset();
      ranges.emplace_back(start, chunk->total_compressed_size());
    }
  } catch (const std::exception& e) {
    return Status::IOError(path, ": ", e.what());
  }
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  for (const auto& [offset, bytes] : ranges) {
    const std::string junk(static_cast<size_t>(bytes), '\x5a');
    f.seekp(offset);
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  if (!f) return Status::IOError(path, ": cannot overwrite");
  return Status::OK();
}

Status TruncateFile(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec) std::filesystem::resize_file(path, size / 2, ec);
  if (ec) return Status::IOError(path, ": ", ec.message());
  return Status::OK();
}

std::vector<std::vector<int32_t>> RandomDocs(int64_t count, const LengthSpec& spec,
                                             uint64_t seed, int32_t vocab) {
  internal::Rng rng(seed);
  std::vector<std::vector<int32_t>> docs(static_cast<size_t>(count));
  for (auto& doc : docs) {
    int64_t len;
    if (spec.near_tokens > 0 && rng.Uniform() < spec.near_fraction) {
      len = static_cast<int64_t>(spec.near_tokens * (0.9 + 0.2 * rng.Uniform()));
    } else {
      // Box-Muller normal, then lognormal around the median.
      const double u1 = std::max(rng.Uniform(), 1e-12), u2 = rng.Uniform();
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2);
      len = static_cast<int64_t>(std::llround(spec.median_tokens * std::exp(spec.sigma * z)));
    }
    len = std::clamp<int64_t>(len, 1, spec.max_tokens);
    doc.resize(static_cast<size_t>(len));
    for (auto& t : doc) t = static_cast<int32_t>(rng.Below(uint64_t(vocab)));
  }
  return docs;
}

Result<DemoDataset> MakeDemoDataset(const std::string& dir, uint64_t seed, int64_t seq_len,
                                    int64_t dp, int64_t micro_batches, double scale) {
  struct Spec {
    const char* name;
    double weight;
    int64_t docs;
    int files;
    LengthSpec lengths;
  };
  const int64_t max_len = 4 * seq_len;
  const Spec specs[] = {
      {"web", 0.6, 6000, 4, {600, 1.2, max_len, 0.01, seq_len}},
      {"code", 0.3, 2500, 3, {1400, 1.0, max_len, 0.03, seq_len}},
      {"math", 0.1, 3000, 2, {350, 0.8, max_len, 0.0, 0}},
  };
  DemoDataset out;
  std::string sources_yaml;
  for (size_t s = 0; s < std::size(specs); ++s) {
    const Spec& spec = specs[s];
    const int64_t docs_total = std::max<int64_t>(
        spec.files, static_cast<int64_t>(std::llround(spec.docs * scale)));
    for (int f = 0; f < spec.files; ++f) {
      const int64_t count = docs_total / spec.files + (f < docs_total % spec.files ? 1 : 0);
      const auto docs = RandomDocs(count, spec.lengths,
                                   internal::DeriveSeed({seed, uint64_t(s), uint64_t(f)}));
      for (const auto& d : docs) out.tokens += static_cast<int64_t>(d.size());
      out.docs += count;
      char name[64];
      std::snprintf(name, sizeof(name), "train-%05d-of-%05d.parquet", f, spec.files);
      TokenFileOptions options;
      options.row_group_rows = 256;
      ARROW_RETURN_NOT_OK(WriteTokenFile(
          (std::filesystem::path(dir) / spec.name / name).string(), docs, options));
    }
    out.source_names.push_back(spec.name);
    sources_yaml += std::string("  - name: ") + spec.name + "\n    path: " + spec.name +
                    "/*.parquet\n    tokens_column: input_ids\n    weight: " +
                    std::to_string(spec.weight) + "\n";
  }
  out.config_path = (std::filesystem::path(dir) / "demo.yaml").string();
  std::ofstream config(out.config_path);
  config << "# Written by `braid demo`: three sources with long-tail document lengths.\n"
         << "seed: " << seed << "\n"
         << "topology: {dp: " << dp << ", tp: 1, pp: 1, cp: 1}\n"
         << "batch: {global_tokens: " << dp * micro_batches * seq_len
         << ", seq_len: " << seq_len << ", micro_batch_size: 1, packing: true}\n"
         << "balance: {cost: {attn: 1.0, linear: " << seq_len
         << "}, algorithm: karmarkar_karp}\n"
         << "sources:\n"
         << sources_yaml << "runtime: {kind: local}\n";
  if (!config) return Status::IOError(out.config_path, ": cannot write");
  return out;
}

Status WriteCaptionFile(const std::string& path, int cut_row, bool two_images) {
  auto png_of = [](int i, int w, int h) {
    std::vector<uint8_t> px(size_t(w * h * 3));
    for (size_t k = 0; k < px.size(); ++k) px[k] = uint8_t(k * 7 + size_t(i));
    return EncodePng(px.data(), w, h);
  };
  auto values = std::make_shared<arrow::BinaryBuilder>();
  arrow::ListBuilder lists(arrow::default_memory_pool(), values);
  arrow::StringBuilder captions;
  for (int i = 0; i < 24; ++i) {
    const int w = 14 + 7 * (i % 5), h = 28 - 3 * (i % 4);
    ARROW_ASSIGN_OR_RAISE(std::string png, png_of(i, w, h));
    if (i == cut_row) png.resize(64);
    if (two_images) ARROW_RETURN_NOT_OK(lists.Append());
    ARROW_RETURN_NOT_OK(values->Append(png));
    if (two_images && i % 3 == 0) {
      ARROW_ASSIGN_OR_RAISE(std::string second, png_of(i + 100, h, w));
      ARROW_RETURN_NOT_OK(values->Append(second));
    }
    ARROW_RETURN_NOT_OK(captions.Append("a small picture number " + std::to_string(i)));
  }
  std::shared_ptr<arrow::Array> ia;
  if (two_images) {
    ARROW_ASSIGN_OR_RAISE(ia, lists.Finish());
  } else {
    ARROW_ASSIGN_OR_RAISE(ia, values->Finish());
  }
  ARROW_ASSIGN_OR_RAISE(auto ca, captions.Finish());
  auto table = arrow::Table::Make(
      arrow::schema({arrow::field("image", ia->type()), arrow::field("caption", arrow::utf8())}),
      {ia, ca});
  ARROW_ASSIGN_OR_RAISE(auto out, arrow::io::FileOutputStream::Open(path));
  return parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out,
                                    /*chunk_size=*/4);
}

SourceConfig CaptionSource(const std::string& path, OnError on_error, int64_t workers,
                           int64_t window_rows) {
  SourceConfig s;
  s.name = "captions";
  s.path = path;
  s.image_column = "image";
  s.text_column = "caption";
  s.image_token_id = 7;
  s.shuffle_window_rows = window_rows;
  s.on_error = on_error;
  s.workers = workers;
  return s;
}

}  // namespace braid::testing
