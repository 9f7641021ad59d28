// A source's Megatron indexed datasets behind SourceFiles (format_reader_internal.h:
// OpenMegatronFiles). Each dataset (P.idx + P.bin) is one file of the source, named by
// its prefix P; its units (what row groups are to Parquet) are runs of consecutive
// documents. Opening reads each index's header and the .bin's size; a unit's token
// counts read its documents' indices and sequence lengths from the .idx, its tokens one
// ranged read of the .bin (MegatronIndex, megatron_index.h). Planning so reads no token.
//
// Unit size: about kUnitBytes of decoded tokens, from the dataset's mean document size
// (the .bin's size over the documents), between 1 and kMaxUnitRows documents: a pure
// function of the .bin's size and the document count, so the order is too.
//
// Thread-compatible (format_reader_internal.h).
#include <algorithm>
#include <cstring>
#include <limits>

#include <arrow/api.h>
#include <arrow/io/api.h>

#include "braid/io/format_reader_internal.h"
#include "braid/io/megatron_index.h"
#include "braid/io/read_memory.h"
#include "braid/util/hash_internal.h"

namespace braid::internal {
namespace {

constexpr int64_t kUnitBytes = int64_t{1} << 20;
constexpr int64_t kMaxUnitRows = 16384;

struct Dataset {
  std::string prefix;
  std::unique_ptr<MegatronIndex> index;
  int64_t bin_bytes = 0;
  int64_t unit_rows = 1;
  std::shared_ptr<arrow::io::RandomAccessFile> bin;  // opened on the first token read
};

// The token type of a Megatron dtype's tokens in Braid: int64 stays, the rest widen to
// int32 (uint8, int8, int16, uint16) or are int32.
bool Wide(const MegatronIndex& index) { return index.item_bytes() == 8; }

class MegatronReader : public FormatReader {
 public:
  MegatronReader(std::shared_ptr<arrow::fs::FileSystem> fs, std::vector<Dataset> datasets)
      : fs_(std::move(fs)), datasets_(std::move(datasets)) {}

  Result<Columns> ReadColumns(int file, int unit) override {
    const Dataset& d = datasets_[size_t(file)];
    const int64_t first = int64_t(unit) * d.unit_rows;
    ARROW_ASSIGN_OR_RAISE(auto tokens,
                          ReadTokens(file, first,
                                     std::min(d.unit_rows, d.index->documents() - first)));
    return Columns{std::move(tokens)};
  }

  Result<std::vector<Columns>> ReadRows(int file, int unit, int64_t first,
                                        int64_t rows) override {
    const Dataset& d = datasets_[size_t(file)];
    ARROW_ASSIGN_OR_RAISE(auto tokens,
                          ReadTokens(file, int64_t(unit) * d.unit_rows + first, rows));
    return std::vector<Columns>{Columns{std::move(tokens)}};
  }

  Result<std::vector<RowLength>> ReadLengths(int file, int unit) override {
    const Dataset& d = datasets_[size_t(file)];
    const int64_t first = int64_t(unit) * d.unit_rows;
    const int64_t n = std::min(d.unit_rows, d.index->documents() - first);
    ARROW_ASSIGN_OR_RAISE(auto docs, d.index->ReadDocuments(first, n, false));
    std::vector<RowLength> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out[size_t(i)].tokens = docs.tokens[size_t(i)];
    return out;
  }

 private:
  // Documents [first, first + n) of dataset `file` as a list<int32> (list<int64> for
  // int64 datasets) array. A dataset written by Megatron's builder stores the sequences
  // back to back, read with one ReadAt; int32 tokens are that buffer, not copied.
  Result<std::shared_ptr<arrow::Array>> ReadTokens(int file, int64_t first, int64_t n) {
    Dataset& d = datasets_[size_t(file)];
    const std::string bin_path = d.prefix + ".bin";
    ARROW_ASSIGN_OR_RAISE(auto docs, d.index->ReadDocuments(first, n, true));
    const int item = d.index->item_bytes();
    const std::string where = "documents " + std::to_string(first) + ".." +
                              std::to_string(first + n);
    int64_t total = 0;
    bool contiguous = true;
    for (size_t q = 0; q < docs.lengths.size(); ++q) {
      const int64_t p = docs.pointers[q];
      const int64_t bytes = int64_t(docs.lengths[q]) * item;
      if (p < 0 || p > d.bin_bytes - bytes) {
        return DataError(bin_path, where + ": sequence " +
                                       std::to_string(docs.first_sequence + int64_t(q)) +
                                       " at byte " + std::to_string(p) + " (+" +
                                       std::to_string(bytes) + ") lies outside the " +
                                       std::to_string(d.bin_bytes) + "-byte file");
      }
      if (q > 0 && p != docs.pointers[q - 1] + int64_t(docs.lengths[q - 1]) * item) {
        contiguous = false;
      }
      total += docs.lengths[q];
    }
    if (total > std::numeric_limits<int32_t>::max()) {
      return DataError(bin_path, where + ": more than 2^31 tokens in one read");
    }
    if (d.bin == nullptr) {
      auto opened = fs_->OpenInputFile(bin_path);
      if (!opened.ok()) return StorageError(bin_path, opened.status().message());
      d.bin = std::move(*opened);
    }
    auto read = [&](int64_t offset, int64_t bytes) -> Result<std::shared_ptr<arrow::Buffer>> {
      auto buf = d.bin->ReadAt(offset, bytes);
      if (!buf.ok()) {
        d.bin.reset();  // reopened by the retry
        return StorageError(bin_path, where + ": " + buf.status().message());
      }
      if ((*buf)->size() != bytes) {
        return DataError(bin_path, where + ": the file ends early (read " +
                                       std::to_string((*buf)->size()) + " of " +
                                       std::to_string(bytes) + " bytes at " +
                                       std::to_string(offset) + ")");
      }
      return std::move(*buf);
    };
    // The raw tokens, back to back.
    std::shared_ptr<arrow::Buffer> raw;
    if (docs.lengths.empty()) {
      ARROW_ASSIGN_OR_RAISE(raw, arrow::AllocateBuffer(0, ReadMemoryPool()));
    } else if (contiguous) {
      ARROW_ASSIGN_OR_RAISE(raw, read(docs.pointers.front(), total * item));
    } else {
      ARROW_ASSIGN_OR_RAISE(auto gathered,
                            arrow::AllocateBuffer(total * item, ReadMemoryPool()));
      int64_t at = 0;
      for (size_t q = 0; q < docs.lengths.size(); ++q) {
        const int64_t bytes = int64_t(docs.lengths[q]) * item;
        if (bytes == 0) continue;
        ARROW_ASSIGN_OR_RAISE(auto part, read(docs.pointers[q], bytes));
        std::memcpy(gathered->mutable_data() + at, part->data(), size_t(bytes));
        at += bytes;
      }
      raw = std::move(gathered);
    }
    // The values as int32 (or int64): widened from narrower codes.
    std::shared_ptr<arrow::Buffer> values;
    const int code = d.index->dtype_code();
    if (item == 4 || item == 8) {
      values = raw;
    } else {
      ARROW_ASSIGN_OR_RAISE(auto wide, arrow::AllocateBuffer(total * 4, ReadMemoryPool()));
      auto* out = reinterpret_cast<int32_t*>(wide->mutable_data());
      const uint8_t* in = raw->data();
      for (int64_t i = 0; i < total; ++i) {
        switch (code) {
          case 1: out[i] = in[i]; break;
          case 2: out[i] = static_cast<int8_t>(in[i]); break;
          case 3: {
            int16_t v;
            std::memcpy(&v, in + 2 * i, 2);
            out[i] = v;
            break;
          }
          default: {  // 8, uint16
            uint16_t v;
            std::memcpy(&v, in + 2 * i, 2);
            out[i] = v;
            break;
          }
        }
      }
      values = std::move(wide);
    }
    ARROW_ASSIGN_OR_RAISE(auto offsets,
                          arrow::AllocateBuffer((n + 1) * 4, ReadMemoryPool()));
    auto* o = reinterpret_cast<int32_t*>(offsets->mutable_data());
    o[0] = 0;
    for (int64_t i = 0; i < n; ++i) o[i + 1] = o[i] + int32_t(docs.tokens[size_t(i)]);
    const bool wide = Wide(*d.index);
    auto value_type = wide ? arrow::int64() : arrow::int32();
    auto value_array = arrow::MakeArray(
        arrow::ArrayData::Make(value_type, total, {nullptr, std::move(values)}, 0));
    auto list = std::make_shared<arrow::ListArray>(arrow::list(value_type), n,
                                                   std::move(offsets),
                                                   std::move(value_array));
    return std::static_pointer_cast<arrow::Array>(list);
  }

  std::shared_ptr<arrow::fs::FileSystem> fs_;
  std::vector<Dataset> datasets_;
};

}  // namespace

Result<std::vector<FormatReader::Columns>> FormatReader::ReadRows(int file, int unit,
                                                                  int64_t first,
                                                                  int64_t rows) {
  ARROW_ASSIGN_OR_RAISE(Columns cols, ReadColumns(file, unit));
  Columns out;
  for (const auto& c : cols) out.push_back(c->Slice(first, rows));
  return std::vector<Columns>{std::move(out)};
}

Result<FormatOpen> OpenMegatronFiles(std::shared_ptr<arrow::fs::FileSystem> fs,
                                     const std::vector<std::string>& prefixes,
                                     const SourceConfig& source,
                                     const std::string& key_path,
                                     const std::vector<ColumnSpec>& columns) {
  (void)key_path;
  FormatOpen out;
  std::vector<Dataset> datasets;
  const bool skip = source.on_error == OnError::kSkip;
  for (const auto& prefix : prefixes) {
    SourceFiles::File file;
    file.path = prefix;
    Dataset d;
    d.prefix = prefix;
    const std::string idx_path = prefix + ".idx";
    const std::string bin_path = prefix + ".bin";
    auto opened = [&]() -> Status {
      auto idx = fs->OpenInputFile(idx_path);
      if (!idx.ok()) return StorageError(idx_path, idx.status().message());
      ARROW_ASSIGN_OR_RAISE(d.index, MegatronIndex::Open(std::move(*idx), idx_path));
      auto info = fs->GetFileInfo(bin_path);
      if (!info.ok()) return StorageError(bin_path, info.status().message());
      if (info->type() != arrow::fs::FileType::File) {
        return DataError(bin_path, "missing: the data file of " + idx_path);
      }
      d.bin_bytes = info->size();
      return Status::OK();
    }();
    if (opened.ok() && columns.size() != 1) {
      opened = DataError(idx_path, "a Megatron dataset has one column, its token ids");
    }
    if (!opened.ok()) {
      if (!skip) return RefuseUnreadable(opened, 1);
      out.KeepUnreadable(std::move(file), opened, "");
      datasets.push_back(std::move(d));
      continue;
    }
    const int64_t docs = d.index->documents();
    const int64_t width = Wide(*d.index) ? 8 : 4;
    const int64_t mean_bytes =
        docs == 0 ? 1
                  : std::max<int64_t>(1, d.bin_bytes / d.index->item_bytes() * width / docs);
    d.unit_rows = std::clamp<int64_t>(kUnitBytes / mean_bytes, 1, kMaxUnitRows);
    for (int64_t first = 0; first < docs; first += d.unit_rows) {
      const int64_t rows = std::min(d.unit_rows, docs - first);
      file.row_group_first_row.push_back(first);
      file.row_group_rows.push_back(rows);
      file.row_group_bytes.push_back(rows * mean_bytes);
      if (!source.length_cache_dir.empty()) {
        file.row_group_digest.push_back(
            Fnv1a(prefix + '|' + std::to_string(d.bin_bytes) + '|' +
                  std::to_string(d.index->sequences()) + '|' + std::to_string(first)));
      }
    }
    file.column = 0;
    file.num_rows = docs;
    out.files.push_back(std::move(file));
    datasets.push_back(std::move(d));
  }
  out.reader = std::make_unique<MegatronReader>(std::move(fs), std::move(datasets));
  return out;
}

}  // namespace braid::internal
