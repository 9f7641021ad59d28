// A source's JSON Lines files behind SourceFiles (format_reader_internal.h:
// OpenJsonlFiles): `.jsonl` / `.json`, plain or compressed (`.gz`, `.zst`), one JSON
// object per line, read with Arrow's JSON reader (arrow::json::StreamingReader) under an
// explicit schema of the columns the transform reads (unexpected fields ignored, a
// missing field null) through Arrow's compressed input streams.
//
// Units. A compressed stream has no seek, so a file is one unit of all its records (the
// shuffle unit: files are permuted, and a file larger than the source's
// shuffle_window_bytes is read in consecutive blocks of records, each a shuffle window
// or part of one); a position inside it is (file, record). Opening a source so reads
// every file once (several side by side: FormatOpen::AddWholeFiles), to count its
// records (its lines holding anything but whitespace, as Arrow's reader skips blank
// ones) and its decoded bytes; a block is read by a streaming reader that stays open,
// so a file's blocks read in order decode it once, and a block behind it (a resume)
// reopens the file and skips the records before.
//
// With runtime.length_cache, the counts of each file are kept there (keyed by its path,
// size and modification time), and a later open of an unchanged file reads them instead.
//
// Errors. A failed read of the underlying file is a storage error (retried by
// SourceFiles); a stream that does not decompress or a line that does not parse is a
// data error naming the file and its records.
//
// Thread-compatible (format_reader_internal.h).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include <arrow/api.h>
#include <arrow/io/api.h>
#include <arrow/io/compressed.h>
#include <arrow/json/api.h>
#include <arrow/util/compression.h>

#include "braid/io/format_reader_internal.h"
#include "braid/io/gzip_codec_internal.h"
#include "braid/io/read_memory.h"
#include "braid/io/source_files_internal.h"

namespace braid::internal {
namespace {

// Counting reads this much decoded at a time. A read that meets a damage returns the
// error, not what it decoded before it: the records of at most one chunk before a damage
// are lost to it.
constexpr int64_t kCountChunkBytes = int64_t{64} << 10;
constexpr int32_t kFirstBlockBytes = int32_t{1} << 22;   // Arrow's JSON block
constexpr int32_t kMaxBlockBytes = int32_t{1} << 30;     // a record may be this long

// A stream that notes in `failed` whether a read of the underlying stream failed, so a
// failure above it (decompression, parsing) is blamed on the bytes, not the storage.
class WatchedStream : public arrow::io::InputStream {
 public:
  WatchedStream(std::shared_ptr<arrow::io::InputStream> inner,
                std::shared_ptr<std::atomic<bool>> failed)
      : inner_(std::move(inner)), failed_(std::move(failed)) {}
  arrow::Status Close() override { return inner_->Close(); }
  bool closed() const override { return inner_->closed(); }
  arrow::Result<int64_t> Tell() const override { return inner_->Tell(); }
  arrow::Result<int64_t> Read(int64_t nbytes, void* out) override {
    auto r = inner_->Read(nbytes, out);
    if (!r.ok()) failed_->store(true);
    return r;
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> Read(int64_t nbytes) override {
    auto r = inner_->Read(nbytes);
    if (!r.ok()) failed_->store(true);
    return r;
  }

 private:
  std::shared_ptr<arrow::io::InputStream> inner_;
  std::shared_ptr<std::atomic<bool>> failed_;
};

// The first `limit` bytes of a stream, then its end: a damaged file's records before
// the damage (JsonlFile::bytes), so the reader never decodes the bad part.
class LimitedStream : public arrow::io::InputStream {
 public:
  LimitedStream(std::shared_ptr<arrow::io::InputStream> inner, int64_t limit)
      : inner_(std::move(inner)), left_(limit) {}
  arrow::Status Close() override { return inner_->Close(); }
  bool closed() const override { return inner_->closed(); }
  arrow::Result<int64_t> Tell() const override { return inner_->Tell(); }
  arrow::Result<int64_t> Read(int64_t nbytes, void* out) override {
    ARROW_ASSIGN_OR_RAISE(const int64_t n, inner_->Read(std::min(nbytes, left_), out));
    left_ -= n;
    return n;
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> Read(int64_t nbytes) override {
    ARROW_ASSIGN_OR_RAISE(auto b, inner_->Read(std::min(nbytes, left_)));
    left_ -= b->size();
    return b;
  }

 private:
  std::shared_ptr<arrow::io::InputStream> inner_;
  int64_t left_;
};

bool EndsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

struct JsonlFile {
  std::string path;
  arrow::Compression::type compression = arrow::Compression::UNCOMPRESSED;
  int64_t records = 0;
  int64_t bytes = -1;  // decoded bytes to read: those before a damage; -1: all
};

class JsonlReader : public FormatReader {
 public:
  JsonlReader(std::shared_ptr<arrow::fs::FileSystem> fs, std::vector<JsonlFile> files,
              std::vector<ColumnSpec> columns, std::shared_ptr<arrow::Schema> schema)
      : fs_(std::move(fs)),
        files_(std::move(files)),
        columns_(std::move(columns)),
        schema_(std::move(schema)) {}

  Result<Columns> ReadColumns(int file, int unit) override {
    ARROW_ASSIGN_OR_RAISE(auto chunks,
                          ReadRows(file, unit, 0, files_[size_t(file)].records));
    Columns out;
    for (size_t c = 0; c < columns_.size(); ++c) {
      arrow::ArrayVector parts;
      for (const auto& chunk : chunks) parts.push_back(chunk[c]);
      if (parts.empty()) {
        ARROW_ASSIGN_OR_RAISE(auto empty, arrow::MakeEmptyArray(schema_->field(int(c))->type()));
        out.push_back(std::move(empty));
      } else if (parts.size() == 1) {
        out.push_back(parts.front());
      } else {
        ARROW_ASSIGN_OR_RAISE(auto whole, arrow::Concatenate(parts, ReadMemoryPool()));
        out.push_back(std::move(whole));
      }
    }
    return out;
  }

  // Arrow's blocks as they come, with no copy into one array.
  Result<std::vector<Columns>> ReadChunks(int file, int unit) override {
    return ReadRows(file, unit, 0, files_[size_t(file)].records);
  }

  // A token source's counts: its lists' lengths (the file is read whole; JSON has no
  // way to skip a list's values).
  Result<std::vector<RowLength>> ReadLengths(int file, int unit) override {
    ARROW_ASSIGN_OR_RAISE(auto cols, ReadColumns(file, unit));
    return ListLengths(*cols.front());
  }
  // A block's counts from its own records: not the whole file's.
  Result<std::optional<std::vector<RowLength>>> ReadRowLengths(int file, int unit,
                                                               int64_t first,
                                                               int64_t rows) override {
    return ListLengthsOfRows(this, file, unit, first, rows);
  }

  Result<std::vector<Columns>> ReadRows(int file, int /*unit*/, int64_t first,
                                        int64_t rows) override {
    auto out = ReadRowsOnce(file, first, rows);
    // A record longer than Arrow's block: again with larger blocks.
    while (!out.ok() && out.status().message().find("straddl") != std::string::npos &&
           block_bytes_ < kMaxBlockBytes) {
      block_bytes_ *= 4;
      Reset();
      out = ReadRowsOnce(file, first, rows);
    }
    return out;
  }

 private:
  void Reset() {
    reader_.reset();
    file_ = -1;
    next_ = 0;
    rest_.clear();
  }

  Status Fail(const JsonlFile& f, int64_t first, int64_t end, const Status& st) {
    const bool storage = failed_ != nullptr && failed_->load();
    Reset();
    const std::string what = "records " + std::to_string(first) + ".." +
                             std::to_string(end) + ": " + OneLine(st.message());
    return storage ? StorageError(f.path, what) : DataError(f.path, what);
  }

  Status Open(int file) {
    Reset();
    const JsonlFile& f = files_[size_t(file)];
    failed_ = std::make_shared<std::atomic<bool>>(false);
    auto raw = fs_->OpenInputStream(f.path);
    if (!raw.ok()) return StorageError(f.path, raw.status().message());
    std::shared_ptr<arrow::io::InputStream> in =
        std::make_shared<WatchedStream>(std::move(*raw), failed_);
    if (f.compression != arrow::Compression::UNCOMPRESSED) {
      ARROW_ASSIGN_OR_RAISE(codec_, MakeReadCodec(f.compression));
      ARROW_ASSIGN_OR_RAISE(in, arrow::io::CompressedInputStream::Make(codec_.get(), in,
                                                                       ReadMemoryPool()));
    }
    if (f.bytes >= 0) in = std::make_shared<LimitedStream>(std::move(in), f.bytes);
    auto read_options = arrow::json::ReadOptions::Defaults();
    read_options.use_threads = false;
    read_options.block_size = block_bytes_;
    auto parse_options = arrow::json::ParseOptions::Defaults();
    parse_options.explicit_schema = schema_;
    parse_options.unexpected_field_behavior = arrow::json::UnexpectedFieldBehavior::Ignore;
    arrow::io::IOContext io(ReadMemoryPool());
    auto reader =
        arrow::json::StreamingReader::Make(std::move(in), read_options, parse_options, io);
    if (!reader.ok()) return Fail(f, 0, f.records, reader.status());
    reader_ = std::move(*reader);
    file_ = file;
    return Status::OK();
  }

  Result<std::vector<Columns>> ReadRowsOnce(int file, int64_t first, int64_t rows) {
    const JsonlFile& f = files_[size_t(file)];
    const int64_t end = first + rows;
    const int64_t behind = rest_.empty() ? next_ : rest_first_;
    if (file_ != file || reader_ == nullptr || behind > first) {
      ARROW_RETURN_NOT_OK(Open(file));
    }
    std::vector<Columns> out;
    int64_t covered = first;
    while (covered < end) {
      Columns piece;
      int64_t at = 0;
      if (!rest_.empty()) {
        piece = std::move(rest_);
        rest_.clear();
        at = rest_first_;
      } else {
        std::shared_ptr<arrow::RecordBatch> batch;
        Status st = reader_->ReadNext(&batch);
        if (!st.ok()) return Fail(f, next_, end, st);
        if (batch == nullptr) {
          Reset();
          return DataError(f.path, "has " + std::to_string(next_) +
                                       " records where opening counted " +
                                       std::to_string(f.records) + " (changed?)");
        }
        for (int c = 0; c < batch->num_columns(); ++c) piece.push_back(batch->column(c));
        at = next_;
        next_ += batch->num_rows();
      }
      if (piece.empty() || piece.front()->length() == 0) continue;
      const int64_t piece_end = at + piece.front()->length();
      if (piece_end <= first) continue;  // before the rows asked for: skipped
      const int64_t take_end = std::min(piece_end, end);
      Columns take;
      for (const auto& a : piece) take.push_back(a->Slice(covered - at, take_end - covered));
      out.push_back(std::move(take));
      if (piece_end > end) {
        for (const auto& a : piece) rest_.push_back(a->Slice(end - at));
        rest_first_ = end;
      }
      covered = take_end;
    }
    return out;
  }

  std::shared_ptr<arrow::fs::FileSystem> fs_;
  std::vector<JsonlFile> files_;
  std::vector<ColumnSpec> columns_;
  std::shared_ptr<arrow::Schema> schema_;
  int32_t block_bytes_ = kFirstBlockBytes;
  // The open reader: file file_, records [0, next_) read; rest_ (records from
  // rest_first_ on) is the part of the last batch past the rows returned.
  int file_ = -1;
  int64_t next_ = 0;
  Columns rest_;
  int64_t rest_first_ = 0;
  std::unique_ptr<arrow::util::Codec> codec_;
  std::shared_ptr<std::atomic<bool>> failed_;
  std::shared_ptr<arrow::json::StreamingReader> reader_;
};

// The records (lines holding anything but whitespace) and decoded bytes of one file. A
// stream that stops decoding part way (truncated, corrupt) gives the records of the
// lines that ended before it, the bytes up to the end of the last of them, and the error
// in `damage`.
Status CountRecords(arrow::fs::FileSystem* fs, const JsonlFile& f, int64_t* records,
                    int64_t* bytes, Status* damage) {
  *records = 0;
  *bytes = 0;
  int64_t lines_end = 0;  // decoded bytes up to the last newline
  auto failed = std::make_shared<std::atomic<bool>>(false);
  auto raw = fs->OpenInputStream(f.path);
  if (!raw.ok()) return StorageError(f.path, raw.status().message());
  std::shared_ptr<arrow::io::InputStream> in =
      std::make_shared<WatchedStream>(std::move(*raw), failed);
  std::unique_ptr<arrow::util::Codec> codec;
  if (f.compression != arrow::Compression::UNCOMPRESSED) {
    ARROW_ASSIGN_OR_RAISE(codec, MakeReadCodec(f.compression));
    ARROW_ASSIGN_OR_RAISE(
        in, arrow::io::CompressedInputStream::Make(codec.get(), in, ReadMemoryPool()));
  }
  bool content = false;  // the current line holds a non-whitespace character
  // One buffer for every chunk (a chunk read as a new buffer would cost an allocation
  // and fresh pages each).
  std::vector<uint8_t> buffer(static_cast<size_t>(kCountChunkBytes));
  while (true) {
    auto chunk = in->Read(kCountChunkBytes, buffer.data());
    if (!chunk.ok()) {
      const std::string what = "cannot read: " + OneLine(chunk.status().message());
      if (failed->load()) return StorageError(f.path, what);
      const std::string codec = arrow::util::Codec::GetCodecAsString(f.compression);
      if (*records == 0) return DataError(f.path, what + " (not " + codec + "?)");
      *damage = DataError(f.path, what + " after " + std::to_string(*records) +
                                      " records (" + std::to_string(lines_end) +
                                      " bytes decoded)");
      *bytes = lines_end;  // the part line after the last newline is not a record
      return Status::OK();
    }
    const int64_t n = *chunk;
    if (n == 0) break;
    *bytes += n;
    // Per line: skip leading whitespace (a blank line is no record), then the line's
    // end by memchr.
    const uint8_t* p = buffer.data();
    const uint8_t* end = p + n;
    while (p < end) {
      if (!content) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) ++p;
        if (p == end) break;
        if (*p == '\n') {
          ++p;
          continue;
        }
        content = true;
      }
      const void* nl = std::memchr(p, '\n', size_t(end - p));
      if (nl == nullptr) break;  // the line goes on in the next chunk
      ++*records;
      content = false;
      p = static_cast<const uint8_t*>(nl) + 1;
      lines_end = *bytes - (end - p);
    }
  }
  *records += content ? 1 : 0;
  return Status::OK();
}

}  // namespace

Result<FormatOpen> OpenJsonlFiles(std::shared_ptr<arrow::fs::FileSystem> fs,
                                  const std::vector<std::string>& paths,
                                  const std::vector<arrow::fs::FileInfo>& stamps,
                                  const SourceConfig& source, const std::string& key_path,
                                  const std::vector<ColumnSpec>& columns) {
  arrow::FieldVector fields;
  for (const auto& c : columns) {
    auto type = JsonColumnType(c);
    if (type == nullptr) {
      return ConfigError(c.key, "cannot be read from JSON Lines (a string, a list of "
                                "token ids, chat messages or an integer field)");
    }
    fields.push_back(arrow::field(c.name, type));
  }
  (void)key_path;
  auto schema = arrow::schema(fields);
  FormatOpen out;
  std::vector<JsonlFile> files(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    JsonlFile& f = files[i];
    f.path = paths[i];
    if (EndsWith(f.path, ".gz")) f.compression = arrow::Compression::GZIP;
    if (EndsWith(f.path, ".zst")) f.compression = arrow::Compression::ZSTD;
  }
  ARROW_ASSIGN_OR_RAISE(
      const std::vector<int64_t> records,
      out.AddWholeFiles(fs.get(), paths, stamps, source, "jsonl-count 1",
                        [&](size_t i, int64_t* n, int64_t* bytes, Status* damage) {
                          return CountRecords(fs.get(), files[i], n, bytes, damage);
                        }));
  for (size_t i = 0; i < files.size(); ++i) {  // out.files[i] is paths[i]'s
    files[i].records = std::max<int64_t>(records[i], 0);
    // A damaged file is read up to the end of its last record before the damage.
    const SourceFiles::File& f = out.files[i];
    if (!f.damaged.empty()) files[i].bytes = f.row_group_bytes.front();
  }
  out.reader = std::make_unique<JsonlReader>(std::move(fs), std::move(files), columns,
                                             std::move(schema));
  return out;
}

}  // namespace braid::internal
