// A source's JSON Lines files behind SourceFiles (format_reader_internal.h:
// OpenJsonlFiles): `.jsonl` / `.json`, plain or compressed (`.gz`, `.zst`), one JSON
// object per line, read with Arrow's JSON reader (arrow::json::StreamingReader) under an
// explicit schema of the columns the transform reads (unexpected fields ignored, a
// missing field null) through Arrow's compressed input streams. A user transform's
// columns and image fields have no type the config gives: they take the types of the
// source's first records (InferredTypes) and hold them (a process keeps what it found
// for its later opens of the source, FirstRecordsKept); an image field's references
// (paths, data: URIs) are loaded into the bytes the transform reads (io/
// image_refs_internal.h) as each block is read.
//
// Units. A compressed stream has no seek, so a file is one unit of all its records (the
// shuffle unit: files are permuted, and a file larger than the source's
// shuffle_window_bytes is read in consecutive blocks of records, each a shuffle window
// or part of one); a position inside it is (file, record). Opening a source so reads
// every file once (several side by side: FormatOpen::AddWholeFiles), to count its
// records (its lines holding anything but whitespace, as Arrow's reader skips blank
// ones) and its decoded bytes; a block is read by a streaming reader that stays open,
// so a file's blocks read in order decode it once, and a block behind it (a resume)
// reopens the file and passes the records before by their line ends, not parsed.
//
// With runtime.length_cache, the counts of each file are kept there (keyed by its path,
// size and modification time), and a later open of an unchanged file reads them instead.
//
// Errors. A failed read of the underlying file is a storage error (retried by
// SourceFiles); a stream that does not decompress, or one that begins a JSON array (a
// `.json` file of another shape), is a data error naming the file (and the records
// before the damage). A line that does not parse (or holds a field of another type) fails
// Arrow's whole block: the file is then read in line mode from that block on (its lines
// parsed a run at a time, halving a run that fails), and the bad line is an error naming
// the file and its record (on_error: fail) or a null record in its place, the other
// records read (skip); why it is null is kept for the loader's skip line (WhyNull).
//
// Thread-compatible (format_reader_internal.h), but WhyNull, which is thread-safe.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include <arrow/api.h>
#include <arrow/io/api.h>
#include <arrow/io/compressed.h>
#include <arrow/json/api.h>
#include <arrow/util/compression.h>

#include "braid/io/file_cache.h"
#include "braid/io/format_reader_internal.h"
#include "braid/io/gzip_codec_internal.h"
#include "braid/io/image_refs_internal.h"
#include "braid/io/read_memory.h"
#include "braid/io/source_files_internal.h"

namespace braid::internal {
namespace {

// Counting reads this much decoded at a time. A read that meets a damage returns the
// error, not what it decoded before it: the records of at most one chunk before a damage
// are lost to it.
constexpr int64_t kCountChunkBytes = int64_t{64} << 10;
constexpr int32_t kFirstBlockBytes = int32_t{1} << 20;   // Arrow's default JSON block
constexpr int32_t kMaxBlockBytes = int32_t{1} << 30;     // a record may be this long
// The records that type a transform's columns and image fields (FirstRecords): those
// of the first block, at most this many (each is parsed alone: ~10 us).
constexpr size_t kFirstRecords = 1000;

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

// `head` (bytes already read from `inner`), then the rest of `inner`.
class PrefixedStream : public arrow::io::InputStream {
 public:
  PrefixedStream(std::string head, std::shared_ptr<arrow::io::InputStream> inner)
      : head_(std::move(head)), inner_(std::move(inner)) {}
  arrow::Status Close() override { return inner_->Close(); }
  bool closed() const override { return inner_->closed(); }
  arrow::Result<int64_t> Tell() const override { return position_; }
  arrow::Result<int64_t> Read(int64_t nbytes, void* out) override {
    int64_t n = 0;
    if (at_ < head_.size()) {
      n = std::min<int64_t>(nbytes, int64_t(head_.size() - at_));
      std::memcpy(out, head_.data() + at_, size_t(n));
      at_ += size_t(n);
    }
    if (n < nbytes) {
      ARROW_ASSIGN_OR_RAISE(const int64_t more,
                            inner_->Read(nbytes - n, static_cast<uint8_t*>(out) + n));
      n += more;
    }
    position_ += n;
    return n;
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> Read(int64_t nbytes) override {
    ARROW_ASSIGN_OR_RAISE(auto buffer, arrow::AllocateResizableBuffer(nbytes));
    ARROW_ASSIGN_OR_RAISE(const int64_t n, Read(nbytes, buffer->mutable_data()));
    ARROW_RETURN_NOT_OK(buffer->Resize(n));
    return std::shared_ptr<arrow::Buffer>(std::move(buffer));
  }

 private:
  std::string head_;
  size_t at_ = 0;
  std::shared_ptr<arrow::io::InputStream> inner_;
  int64_t position_ = 0;
};

// The characters a line may hold and still be no record (blank: Arrow skips it); one
// rule for counting at open and for finding a bad line.
bool Space(uint8_t c) { return c == ' ' || c == '\t' || c == '\r'; }
bool Blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return Space(uint8_t(c)); });
}

// The record ends in decoded bytes fed in order: a line holding anything but whitespace
// ends a record at its newline (a blank line is none). Counting at open and skipping to
// a record (a resume inside a file) find records by it, by memchr, without parsing.
class RecordEnds {
 public:
  // Scans [p, end) for at most `most` record ends; adds how many it found to *found and
  // returns the position after the last of them (p when none).
  const uint8_t* Scan(const uint8_t* p, const uint8_t* end, int64_t most,
                      int64_t* found) {
    const uint8_t* after = p;
    while (p < end && most > 0) {
      if (!in_record_) {
        while (p < end && Space(*p)) ++p;
        if (p == end) break;
        if (*p == '\n') {
          ++p;
          continue;
        }
        in_record_ = true;
      }
      const void* nl = std::memchr(p, '\n', size_t(end - p));
      if (nl == nullptr) break;  // the line goes on in the next chunk
      ++*found;
      --most;
      in_record_ = false;
      p = static_cast<const uint8_t*>(nl) + 1;
      after = p;
    }
    return after;
  }
  // A record has begun and not ended (at the end of the file: a last line with no
  // newline, which is a record too).
  bool in_record() const { return in_record_; }

 private:
  bool in_record_ = false;
};

bool EndsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

struct JsonlFile {
  std::string path;
  arrow::fs::FileInfo stamp;  // SourceFiles' (the cache's key)
  arrow::Compression::type compression = arrow::Compression::UNCOMPRESSED;
  int64_t records = 0;
  int64_t bytes = -1;  // decoded bytes to read: those before a damage; -1: all
  std::string image_folder;  // where its image fields' relative paths are found
};

// File f's bytes: its copy in `cache` (runtime.cache; downloaded whole the first time,
// which counting does anyway, so the file crosses the network once), else the remote
// file. A storage failure is a storage error naming the file.
Result<std::shared_ptr<arrow::io::InputStream>> OpenRaw(arrow::fs::FileSystem* fs,
                                                        FileCache* cache,
                                                        const JsonlFile& f) {
  if (cache != nullptr) {
    auto local = cache->Open(fs, f.stamp, /*download=*/true);
    if (!local.ok()) return StorageError(f.path, local.status().message());
    if (*local) return std::shared_ptr<arrow::io::InputStream>(std::move(*local));
  }
  auto raw = fs->OpenInputStream(f.path);
  if (!raw.ok()) return StorageError(f.path, raw.status().message());
  return std::move(*raw);
}

// File f's decoded bytes from its start (its raw bytes through OpenRaw, decompressed by
// `codec`, made here, which must outlive the stream); `failed` notes a failed read of the
// raw bytes.
Result<std::shared_ptr<arrow::io::InputStream>> DecodedStream(
    arrow::fs::FileSystem* fs, FileCache* cache, const JsonlFile& f,
    std::shared_ptr<std::atomic<bool>> failed, std::unique_ptr<arrow::util::Codec>* codec) {
  ARROW_ASSIGN_OR_RAISE(auto raw, OpenRaw(fs, cache, f));
  std::shared_ptr<arrow::io::InputStream> in =
      std::make_shared<WatchedStream>(std::move(raw), std::move(failed));
  if (f.compression == arrow::Compression::UNCOMPRESSED) return in;
  ARROW_ASSIGN_OR_RAISE(*codec, MakeReadCodec(f.compression));
  return arrow::io::CompressedInputStream::Make(codec->get(), in, ReadMemoryPool());
}

class JsonlReader : public FormatReader {
 public:
  // `images`: per column, whether it is an image field, its references loaded (ReadRows).
  JsonlReader(std::shared_ptr<arrow::fs::FileSystem> fs, std::shared_ptr<FileCache> cache,
              std::vector<JsonlFile> files, std::vector<ColumnSpec> columns,
              std::shared_ptr<arrow::Schema> schema, std::vector<bool> images,
              bool skip_bad_lines)
      : fs_(std::move(fs)),
        cache_(std::move(cache)),
        files_(std::move(files)),
        columns_(std::move(columns)),
        schema_(std::move(schema)),
        images_(std::move(images)),
        skip_bad_lines_(skip_bad_lines) {}

  Result<Columns> ReadColumns(int file, int unit) override {
    ARROW_ASSIGN_OR_RAISE(auto chunks,
                          ReadRows(file, unit, 0, files_[size_t(file)].records));
    return Joined(chunks);
  }

  std::string WhyNull(int file, int64_t row) const override {
    std::lock_guard<std::mutex> lock(bad_mu_);
    const auto it = bad_.find({file, row});
    return it == bad_.end() ? std::string() : it->second;
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
    if (!out.ok() || std::find(images_.begin(), images_.end(), true) == images_.end()) {
      return out;
    }
    return WithImages(file, first, std::move(*out));
  }

 private:
  // Consecutive chunks of rows as one array per column (one chunk: as it is).
  Result<Columns> Joined(const std::vector<Columns>& chunks) const {
    Columns out;
    for (size_t c = 0; c < columns_.size(); ++c) {
      arrow::ArrayVector parts;
      for (const auto& chunk : chunks) parts.push_back(chunk[c]);
      if (parts.empty()) {
        ARROW_ASSIGN_OR_RAISE(auto empty,
                              arrow::MakeEmptyArray(schema_->field(int(c))->type()));
        if (images_[c]) {  // of the type its references load as
          ARROW_ASSIGN_OR_RAISE(auto loaded, LoadImageRefs(fs_.get(), "", *empty));
          empty = std::move(loaded.bytes);
        }
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

  // `chunks` (records from `first` on of file `file`) with each image field's references
  // loaded: a record whose image does not load is an error naming it (on_error: fail)
  // or its image is null, why kept for WhyNull (skip).
  Result<std::vector<Columns>> WithImages(int file, int64_t first,
                                          std::vector<Columns> chunks) {
    const JsonlFile& f = files_[size_t(file)];
    int64_t at = first;
    for (auto& chunk : chunks) {
      for (size_t c = 0; c < chunk.size(); ++c) {
        if (!images_[c]) continue;
        ARROW_ASSIGN_OR_RAISE(
            LoadedImages loaded,
            LoadImageRefs(fs_.get(), f.image_folder, *chunk[c], cache_.get()));
        if (!loaded.bad.empty() && !skip_bad_lines_) {
          const auto& [row, why] = loaded.bad.front();
          return WithSkipHint(DataError(DataLocation(f.path, -1, at + row),
                                        "field '" + columns_[c].name + "': " + why),
                              "such records");
        }
        if (!loaded.bad.empty()) {
          std::lock_guard<std::mutex> lock(bad_mu_);
          for (const auto& [row, why] : loaded.bad) {
            if (bad_.size() < kBadLinesKept) {
              bad_.emplace(std::make_pair(file, at + row),
                           "field '" + columns_[c].name + "': " + why);
            }
          }
        }
        chunk[c] = std::move(loaded.bytes);
      }
      if (!chunk.empty()) at += chunk.front()->length();
    }
    return chunks;
  }

  void Reset() {
    reader_.reset();
    line_in_.reset();
    pending_.clear();
    pending_at_ = 0;
    clean_line_blocks_ = 0;
    file_ = -1;
    next_ = 0;
    at_end_ = false;
    first_block_error_ = Status::OK();
    rest_.clear();
  }

  Status Fail(const JsonlFile& f, int64_t first, int64_t end, const Status& st) {
    const bool storage = failed_ != nullptr && failed_->load();
    Reset();
    const std::string what = "records " + std::to_string(first) + ".." +
                             std::to_string(end) + ": " + OneLine(st.message());
    return storage ? StorageError(f.path, what) : DataError(f.path, what);
  }

  // File f's decoded bytes (up to a damage: JsonlFile::bytes), its storage failures
  // noted in a fresh failed_.
  Result<std::shared_ptr<arrow::io::InputStream>> OpenDecoded(const JsonlFile& f) {
    failed_ = std::make_shared<std::atomic<bool>>(false);
    ARROW_ASSIGN_OR_RAISE(auto in,
                          DecodedStream(fs_.get(), cache_.get(), f, failed_, &codec_));
    if (f.bytes >= 0) in = std::make_shared<LimitedStream>(std::move(in), f.bytes);
    return in;
  }

  arrow::json::ParseOptions ParseOptions() const {
    auto parse_options = arrow::json::ParseOptions::Defaults();
    parse_options.explicit_schema = schema_;
    parse_options.unexpected_field_behavior = arrow::json::UnexpectedFieldBehavior::Ignore;
    return parse_options;
  }

  // A streaming reader of `in` (file `file`'s decoded bytes from its record `next`).
  Status StartReader(const JsonlFile& f, int file,
                     std::shared_ptr<arrow::io::InputStream> in, int64_t next) {
    auto read_options = arrow::json::ReadOptions::Defaults();
    read_options.use_threads = false;
    read_options.block_size = block_bytes_;
    arrow::io::IOContext io(ReadMemoryPool());
    auto reader = arrow::json::StreamingReader::Make(std::move(in), read_options,
                                                     ParseOptions(), io);
    file_ = file;
    next_ = next;
    if (!reader.ok()) {  // Make parses the first block
      reader_.reset();
      if (!ALineFailed(reader.status())) return Fail(f, next, f.records, reader.status());
      first_block_error_ = reader.status();  // the next read finds the lines
      return Status::OK();
    }
    reader_ = std::move(*reader);
    return Status::OK();
  }

  // True if `st`, from Arrow's reader, is a line that does not parse: not a failed read
  // of the file, not a record longer than the block (ReadRows reads it with larger ones).
  bool ALineFailed(const Status& st) const {
    return !st.ok() && !failed_->load() &&
           st.message().find("straddl") == std::string::npos;
  }

  // File f's decoded bytes from its record `first`: the records before it are passed by
  // their line ends (RecordEnds), decoded but not parsed, so a resume inside a file costs
  // its decompression up to there, not a parse. Sets *passed to the records passed:
  // fewer than `first` in a file with fewer records than counted (the reader finds it).
  Result<std::shared_ptr<arrow::io::InputStream>> DecodedFrom(const JsonlFile& f,
                                                              int64_t first,
                                                              int64_t* passed) {
    ARROW_ASSIGN_OR_RAISE(auto in, OpenDecoded(f));
    RecordEnds ends;
    *passed = 0;
    std::vector<uint8_t> buffer;
    while (*passed < first) {
      buffer.resize(static_cast<size_t>(kCountChunkBytes));
      auto n = in->Read(kCountChunkBytes, buffer.data());
      if (!n.ok()) return Fail(f, 0, first, n.status());
      if (*n == 0) break;
      const uint8_t* end = buffer.data() + *n;
      const uint8_t* after = ends.Scan(buffer.data(), end, first - *passed, passed);
      if (*passed == first) {  // the rest of the chunk is the reader's
        std::string rest(reinterpret_cast<const char*>(after), size_t(end - after));
        in = std::make_shared<PrefixedStream>(std::move(rest), std::move(in));
      }
    }
    return in;
  }

  // File `file` opened for the streaming reader to parse from record `first`.
  Status OpenAt(int file, int64_t first) {
    Reset();
    const JsonlFile& f = files_[size_t(file)];
    int64_t passed = 0;
    ARROW_ASSIGN_OR_RAISE(auto in, DecodedFrom(f, first, &passed));
    return StartReader(f, file, std::move(in), passed);
  }

  // Lines [a, b) (records first + a ..) parsed: a run of lines that parses is one part,
  // a line that does not is a null record (its error in `bad`, by record). Where a parse
  // fails, the row Arrow's error names (" in row R") splits the run: the lines before
  // it, the line itself, the lines after; an error that names none halves the run.
  Status ParseLines(const std::vector<std::string>& lines, size_t a, size_t b,
                    int64_t first, std::vector<Columns>* parts,
                    std::vector<std::pair<int64_t, std::string>>* bad) {
    while (a < b) {
      std::string text;
      for (size_t i = a; i < b; ++i) (text += lines[i]) += '\n';
      auto batch = arrow::json::ParseOne(ParseOptions(), arrow::Buffer::FromString(text));
      if (batch.ok()) {
        Columns cols;
        for (const auto& field : schema_->fields()) {
          auto column = (*batch)->GetColumnByName(field->name());
          if (column == nullptr) {
            ARROW_ASSIGN_OR_RAISE(column, arrow::MakeArrayOfNull(field->type(),
                                                                 int64_t(b - a)));
          }
          cols.push_back(std::move(column));
        }
        parts->push_back(std::move(cols));
        return Status::OK();
      }
      std::string why = OneLine(batch.status().message());
      size_t row = b - a;  // the row the error names; b - a: none
      if (const size_t in_row = why.rfind(" in row "); in_row != std::string::npos &&
          in_row + 8 < why.size() &&
          why.find_first_not_of("0123456789", in_row + 8) == std::string::npos) {
        row = std::min<size_t>(b - a, std::stoull(why.substr(in_row + 8)));
        why.resize(in_row);
      }
      if (b - a == 1) {  // this record does not parse: named by its record, not row 0
        bad->emplace_back(first + int64_t(a), std::move(why));
        Columns cols;
        for (const auto& field : schema_->fields()) {
          ARROW_ASSIGN_OR_RAISE(auto nulls, arrow::MakeArrayOfNull(field->type(), 1));
          cols.push_back(std::move(nulls));
        }
        parts->push_back(std::move(cols));
        return Status::OK();
      }
      if (row < b - a) {  // the lines before the row, the row alone, then the rest
        ARROW_RETURN_NOT_OK(ParseLines(lines, a, a + row, first, parts, bad));
        ARROW_RETURN_NOT_OK(ParseLines(lines, a + row, a + row + 1, first, parts, bad));
        a += row + 1;
      } else {
        const size_t mid = a + (b - a) / 2;
        ARROW_RETURN_NOT_OK(ParseLines(lines, a, mid, first, parts, bad));
        a = mid;
      }
    }
    return Status::OK();
  }

  // Line mode. The streaming reader of file `file` failed (`cause`) on the block from
  // record next_, which Arrow's reader fails whole: the file is read again from that
  // record (passed by RecordEnds) a line at a time, the lines of a block parsed a run at
  // a time (ParseLines); a line that does not parse is an error naming its record
  // (on_error: fail) or a null record in its place, why kept for WhyNull (skip), and the
  // others are read. The file stays in line mode, with no reopening, until
  // kCleanLineBlocks blocks in a row parse whole; then a streaming reader goes on from
  // there (a file of many bad lines is so decoded about once, not once per bad block).
  Status EnterLineMode(int file) {
    const JsonlFile& f = files_[size_t(file)];
    const int64_t first = next_;
    reader_.reset();
    int64_t passed = 0;
    ARROW_ASSIGN_OR_RAISE(line_in_, DecodedFrom(f, first, &passed));
    file_ = file;
    next_ = passed;
    pending_.clear();
    pending_at_ = 0;
    clean_line_blocks_ = 0;
    return Status::OK();
  }

  // Line mode's next line (without its newline); false at the end of the file.
  Result<bool> NextLine(std::string* line) {
    line->clear();
    while (true) {
      const size_t nl = pending_.find('\n', pending_at_);
      if (nl != std::string::npos) {
        line->append(pending_, pending_at_, nl - pending_at_);
        pending_at_ = nl + 1;
        return true;
      }
      line->append(pending_, pending_at_, std::string::npos);
      pending_.resize(static_cast<size_t>(kCountChunkBytes));
      pending_at_ = 0;
      ARROW_ASSIGN_OR_RAISE(const int64_t n,
                            line_in_->Read(kCountChunkBytes, pending_.data()));
      pending_.resize(size_t(n));
      if (n == 0) return !line->empty();  // a last line without a newline is one
    }
  }

  // Line mode's next block of records (none at the file's end). `cause`: the streaming
  // reader's error that entered line mode, returned if the block's lines all parse (it
  // was not a line's fault).
  Result<Columns> ReadLineBlock(int file, const Status* cause) {
    const JsonlFile& f = files_[size_t(file)];
    const int64_t first = next_;
    std::vector<std::string> lines;  // records [first, first + lines.size())
    std::string line;
    int64_t bytes = 0;
    while (bytes < block_bytes_) {
      auto more = NextLine(&line);
      if (!more.ok()) return Fail(f, first, f.records, more.status());
      if (!*more) {
        at_end_ = true;
        break;
      }
      if (Blank(line)) continue;
      bytes += int64_t(line.size()) + 1;
      lines.push_back(std::move(line));
    }
    if (lines.empty()) return Columns{};
    std::vector<Columns> parts;
    std::vector<std::pair<int64_t, std::string>> bad;
    ARROW_RETURN_NOT_OK(ParseLines(lines, 0, lines.size(), first, &parts, &bad));
    if (bad.empty() && cause != nullptr) return Fail(f, first, f.records, *cause);
    if (!bad.empty() && !skip_bad_lines_) {
      Reset();
      return WithSkipHint(DataError(DataLocation(f.path, -1, bad.front().first),
                                    "does not parse as JSON: " + bad.front().second),
                          "such records");
    }
    if (!bad.empty()) {
      // Why each is null, for the loader's skip line (WhyNull).
      std::lock_guard<std::mutex> lock(bad_mu_);
      for (const auto& [at, why] : bad) {
        if (bad_.size() < size_t(kBadLinesKept)) {
          bad_.emplace(std::make_pair(file, at), "does not parse as JSON (" + why + ")");
        }
      }
    }
    clean_line_blocks_ = bad.empty() ? clean_line_blocks_ + 1 : 0;
    ARROW_ASSIGN_OR_RAISE(Columns block, Joined(parts));
    next_ = first + static_cast<int64_t>(lines.size());
    if (!at_end_ && clean_line_blocks_ >= kCleanLineBlocks) {
      // Back to a streaming reader, from the bytes after the lines read.
      std::string rest = pending_.substr(pending_at_);
      pending_.clear();
      pending_at_ = 0;
      ARROW_RETURN_NOT_OK(StartReader(
          f, file, std::make_shared<PrefixedStream>(std::move(rest), std::move(line_in_)),
          next_));
      line_in_.reset();
    }
    return block;
  }

  Result<std::vector<Columns>> ReadRowsOnce(int file, int64_t first, int64_t rows) {
    const JsonlFile& f = files_[size_t(file)];
    const int64_t end = first + rows;
    const int64_t behind = rest_.empty() ? next_ : rest_first_;
    if (file_ != file || behind > first ||
        (reader_ == nullptr && line_in_ == nullptr && !at_end_ &&
         first_block_error_.ok())) {
      ARROW_RETURN_NOT_OK(OpenAt(file, first));
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
      } else if (line_in_ != nullptr && !at_end_) {  // line mode
        at = next_;
        ARROW_ASSIGN_OR_RAISE(piece, ReadLineBlock(file, nullptr));
      } else {
        std::shared_ptr<arrow::RecordBatch> batch;
        Status st = first_block_error_;
        first_block_error_ = Status::OK();
        if (st.ok() && reader_ != nullptr) st = reader_->ReadNext(&batch);
        if (!st.ok() && !ALineFailed(st)) {
          // Storage (retried), or a record longer than the block (ReadRows).
          return Fail(f, next_, end, st);
        }
        if (!st.ok()) {  // a line that does not parse
          ARROW_RETURN_NOT_OK(EnterLineMode(file));
          at = next_;
          ARROW_ASSIGN_OR_RAISE(piece, ReadLineBlock(file, &st));
        } else if (batch == nullptr) {
          Reset();
          return DataError(f.path, "has " + std::to_string(next_) +
                                       " records where opening counted " +
                                       std::to_string(f.records) + " (changed?)");
        } else {
          for (int c = 0; c < batch->num_columns(); ++c) {
            piece.push_back(batch->column(c));
          }
          at = next_;
          next_ += batch->num_rows();
        }
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
  std::shared_ptr<FileCache> cache_;  // runtime.cache, or null
  std::vector<JsonlFile> files_;
  std::vector<ColumnSpec> columns_;
  std::shared_ptr<arrow::Schema> schema_;
  const std::vector<bool> images_;  // per column: an image field (WithImages)
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
  bool at_end_ = false;  // file_'s records were read to its end (no reader_)
  // Line mode (EnterLineMode): file_'s decoded bytes after what pending_ holds, the
  // bytes read and not yet split into lines (from pending_at_), and the blocks in a row
  // whose lines all parsed.
  static constexpr int kCleanLineBlocks = 8;
  std::shared_ptr<arrow::io::InputStream> line_in_;
  std::string pending_;
  size_t pending_at_ = 0;
  int clean_line_blocks_ = 0;
  // No reader_: making it failed on a line of its first block, from record next_.
  Status first_block_error_;
  // Why records did not parse (on_error: skip), the first kBadLinesKept of them: a
  // corpus of many bad lines keeps the first reasons, not every one.
  static constexpr size_t kBadLinesKept = 1000;
  const bool skip_bad_lines_;
  mutable std::mutex bad_mu_;
  std::map<std::pair<int, int64_t>, std::string> bad_;  // GUARDED_BY(bad_mu_)
};

// The records (lines holding anything but whitespace) and decoded bytes of one file. A
// stream that stops decoding part way (truncated, corrupt) gives the records of the
// lines that ended before it, the bytes up to the end of the last of them, and the error
// in `damage`.
Status CountRecords(arrow::fs::FileSystem* fs, FileCache* cache, const JsonlFile& f,
                    int64_t* records, int64_t* bytes, Status* damage) {
  *records = 0;
  *bytes = 0;
  int64_t lines_end = 0;  // decoded bytes up to the last newline
  auto failed = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<arrow::util::Codec> codec;
  ARROW_ASSIGN_OR_RAISE(auto in, DecodedStream(fs, cache, f, failed, &codec));
  RecordEnds ends;
  bool begun = false;  // a byte other than whitespace was read
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
    const uint8_t* end = buffer.data() + n;
    if (!begun) {  // a JSON array of records is a file of another format
      const uint8_t* start = buffer.data();
      const uint8_t* first = std::find_if(start, end, [](uint8_t c) {
        return !Space(c) && c != '\n';
      });
      begun = first != end;
      if (begun && *first == '[') {
        return DataError(f.path, "holds a JSON array, not JSON Lines: records are read "
                                 "one JSON object per line (jq -c '.[]' writes an "
                                 "array's objects so)");
      }
    }
    *bytes += n;
    int64_t found = 0;
    const uint8_t* after =
        ends.Scan(buffer.data(), end, std::numeric_limits<int64_t>::max(), &found);
    if (found > 0) {
      *records += found;
      lines_end = *bytes - (end - after);
    }
  }
  *records += ends.in_record() ? 1 : 0;
  return Status::OK();
}


// `type` as a record's JSON says it: what inference adds is undone (a string that reads
// as a date, which Arrow types a timestamp, stays the string).
std::shared_ptr<arrow::DataType> AsWritten(const std::shared_ptr<arrow::DataType>& type) {
  switch (type->id()) {
    case arrow::Type::TIMESTAMP:
      return arrow::utf8();
    case arrow::Type::LIST: {
      const auto& item = static_cast<const arrow::ListType&>(*type).value_field();
      return arrow::list(item->WithType(AsWritten(item->type())));
    }
    case arrow::Type::STRUCT: {
      arrow::FieldVector fields;
      for (const auto& field : type->fields()) {
        fields.push_back(field->WithType(AsWritten(field->type())));
      }
      return arrow::struct_(fields);
    }
    default:
      return type;
  }
}

// True if `type` holds a null type (no value said what it is: a null, an empty list).
bool HoldsNull(const arrow::DataType& type) {
  if (type.id() == arrow::Type::NA) return true;
  for (const auto& field : type.fields()) {
    if (HoldsNull(*field->type())) return true;
  }
  return false;
}

// The records (lines holding anything) of file `f`'s first block, at most kFirstRecords
// of them: at least one, however long, up to a record's limit.
Result<std::vector<std::string>> FirstRecords(arrow::fs::FileSystem* fs, FileCache* cache,
                                              const JsonlFile& f) {
  auto failed = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<arrow::util::Codec> codec;  // outlives the stream that uses it
  ARROW_ASSIGN_OR_RAISE(auto in, DecodedStream(fs, cache, f, failed, &codec));
  if (f.bytes >= 0) in = std::make_shared<LimitedStream>(std::move(in), f.bytes);
  std::string text;
  size_t lines_end = 0;
  bool at_end = false;
  while (!at_end && (text.size() < size_t(kFirstBlockBytes) || lines_end == 0) &&
         text.size() < size_t(kMaxBlockBytes)) {
    const size_t had = text.size();
    text.resize(had + size_t(kCountChunkBytes));
    auto n = in->Read(kCountChunkBytes, text.data() + had);
    if (!n.ok()) {
      const std::string what = "cannot read: " + OneLine(n.status().message());
      return failed->load() ? StorageError(f.path, what) : DataError(f.path, what);
    }
    text.resize(had + size_t(*n));
    at_end = *n == 0;
    const size_t nl = text.rfind('\n');
    if (nl != std::string::npos && nl >= had) lines_end = nl + 1;
  }
  if (at_end) lines_end = text.size();  // the last line may lack its newline
  std::vector<std::string> records;
  for (size_t at = 0; at < lines_end && records.size() < kFirstRecords;) {
    const size_t nl = std::min(text.find('\n', at), lines_end);
    std::string_view line(text.data() + at, nl - at);
    at = nl + 1;
    if (!Blank(line)) records.emplace_back(line);
  }
  return records;
}

// The fields of `records` (the first records of a file: FirstRecords), first seen
// first: each record typed alone by Arrow's JSON inference, what inference adds undone
// (AsWritten), and the types merged over the records as Arrow unifies schemas
// (permissive: an integer and a float give a float, a null or an empty list takes the
// other's type, objects the union of their fields); a field whose types do not merge
// is null, with why in *mixed. Only `names` (all fields when empty) are kept, so a field
// nobody reads may hold anything; a record that does not parse does not count (the
// first such error in *unparsed).
struct RecordFields {
  std::vector<std::string> order;
  std::map<std::string, std::shared_ptr<arrow::Field>> fields;
  std::map<std::string, std::string> mixed;
  Status unparsed;
  int64_t parsed = 0;
};
RecordFields TypeRecords(const std::vector<std::string>& records,
                         const std::vector<std::string>& names) {
  auto parse_options = arrow::json::ParseOptions::Defaults();
  parse_options.unexpected_field_behavior =
      arrow::json::UnexpectedFieldBehavior::InferType;
  parse_options.newlines_in_values = true;  // a WebDataset JSON member may span lines
  RecordFields out;
  for (const std::string& line : records) {
    auto batch = arrow::json::ParseOne(parse_options, arrow::Buffer::FromString(line));
    if (!batch.ok()) {
      if (out.unparsed.ok()) out.unparsed = batch.status();
      continue;
    }
    ++out.parsed;
    for (const auto& field : (*batch)->schema()->fields()) {
      if (!names.empty() &&
          std::find(names.begin(), names.end(), field->name()) == names.end()) {
        continue;
      }
      auto written = field->WithType(AsWritten(field->type()));
      auto [it, added] = out.fields.emplace(field->name(), written);
      if (added) {
        out.order.push_back(field->name());
      } else if (it->second != nullptr) {
        auto merged =
            it->second->MergeWith(*written, arrow::Field::MergeOptions::Permissive());
        if (!merged.ok()) out.mixed[field->name()] = OneLine(merged.status().message());
        it->second = merged.ok() ? *merged : nullptr;
      }
    }
  }
  return out;
}

// The type of each of `columns` (a user transform's, ColumnSpec::any_type, or an image
// field) in the first records of file `f` (the source's first file in path order that
// holds any; TypeOfFields), held for every record of the source.
Result<std::vector<std::shared_ptr<arrow::DataType>>> InferredTypes(
    const std::vector<std::string>& records, const JsonlFile& f,
    const std::vector<const ColumnSpec*>& columns) {
  std::vector<std::pair<std::string, std::string>> fields;
  for (const ColumnSpec* c : columns) fields.emplace_back(c->name, c->key);
  return TypeOfFields(records, f.path, fields,
                      "a JSON Lines source gives a transform's column the type its first "
                      "file's first records (1,000, at most 1 MiB) have, and holds it");
}

// The mean bytes of the images that field `name` (of `type`) names in the first
// kImageSample of `records` (file `f`'s first), which load: what a record's images add
// to its file's decoded bytes, about. 0 when none loads.
Result<int64_t> ImageBytesPerRecord(arrow::fs::FileSystem* fs, FileCache* cache,
                                    const std::vector<std::string>& records,
                                    const JsonlFile& f, const std::string& name,
                                    const std::shared_ptr<arrow::DataType>& type) {
  constexpr size_t kImageSample = 16;
  std::string sample;
  const size_t n = std::min(records.size(), kImageSample);
  for (size_t i = 0; i < n; ++i) (sample += records[i]) += '\n';
  auto parse_options = arrow::json::ParseOptions::Defaults();
  parse_options.explicit_schema = arrow::schema({arrow::field(name, type)});
  parse_options.unexpected_field_behavior = arrow::json::UnexpectedFieldBehavior::Ignore;
  auto batch = arrow::json::ParseOne(parse_options, arrow::Buffer::FromString(sample));
  if (!batch.ok() || n == 0) return 0;  // a bad record is found (and named) when read
  ARROW_ASSIGN_OR_RAISE(LoadedImages loaded,
                        LoadImageRefs(fs, f.image_folder, *(*batch)->column(0), cache));
  int64_t bytes = 0;
  const auto& list = *loaded.bytes;
  const auto& values = static_cast<const arrow::BinaryArray&>(
      list.type_id() == arrow::Type::LIST
          ? *static_cast<const arrow::ListArray&>(list).values()
          : list);
  for (int64_t k = 0; k < values.length(); ++k) bytes += values.value_length(k);
  return bytes / int64_t(n);
}

// `folder` (image.folder: a local path or a URI) as a path on `fs`, the source's
// filesystem (`s3://bucket/key` is `bucket/key` there; no filesystem is made for the
// URI); a folder on another filesystem is a config error naming `key`.
Result<std::string> FolderOn(const arrow::fs::FileSystem& fs, const std::string& folder,
                             const std::string& key) {
  std::string path = folder;
  std::string type = "local";
  if (const size_t colon = folder.find("://"); colon != std::string::npos) {
    const std::string scheme = folder.substr(0, colon);
    path = folder.substr(colon + 3);
    path = path.substr(0, path.find('?'));  // storage options are the source's
    type = scheme == "file" ? "local" : scheme == "gs" ? "gcs" : scheme;
  }
  if (type != fs.type_name()) {
    return ConfigError(key, "'" + folder + "' is on a " + type +
                                " filesystem, the source's files on a " + fs.type_name() +
                                " one; the images must be on the source's");
  }
  return path;
}

}  // namespace

Result<std::vector<std::shared_ptr<arrow::DataType>>> TypeOfFields(
    const std::vector<std::string>& records, const std::string& file,
    const std::vector<std::pair<std::string, std::string>>& fields,
    const std::string& rule) {
  std::vector<std::string> names;
  for (const auto& [name, key] : fields) names.push_back(name);
  const RecordFields typed = TypeRecords(records, names);
  if (typed.parsed == 0 && !typed.unparsed.ok()) {
    return DataError(file, "the types of the transform's columns are taken from its "
                           "first records, and none of them parses: " +
                               OneLine(typed.unparsed.message()));
  }
  std::vector<std::shared_ptr<arrow::DataType>> types;
  for (const auto& [name, key] : fields) {
    if (const auto it = typed.mixed.find(name); it != typed.mixed.end()) {
      return DataError(file, "field '" + name + "' has types that do not unify in "
                             "its first records (each record's type is taken from "
                             "there, and held): " + it->second);
    }
    const auto it = typed.fields.find(name);
    const auto field = it == typed.fields.end() ? nullptr : it->second;
    if (field == nullptr || HoldsNull(*field->type())) {
      return ConfigError(key, "field '" + name +
                                  "' has no value in the first records of " + file +
                                  " to take its type from (" +
                                  (field == nullptr ? "no record there has it"
                                                    : "only nulls or empty lists: " +
                                                          field->type()->ToString()) +
                                  "); " + rule);
    }
    types.push_back(field->type());
  }
  return types;
}

Result<std::vector<std::pair<std::string, std::string>>> JsonlFieldTypes(
    arrow::fs::FileSystem* fs, const std::string& path) {
  JsonlFile f;
  f.path = path;
  if (EndsWith(path, ".gz")) f.compression = arrow::Compression::GZIP;
  if (EndsWith(path, ".zst")) f.compression = arrow::Compression::ZSTD;
  ARROW_ASSIGN_OR_RAISE(const auto records, FirstRecords(fs, nullptr, f));
  const RecordFields typed = TypeRecords(records, /*names=*/{});
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& name : typed.order) {
    const auto& field = typed.fields.at(name);
    out.emplace_back(name, field == nullptr ? "mixed types" : field->type()->ToString());
  }
  return out;
}

// What a file's first records said of a source's typed columns (InferredTypes) and of
// its image fields (ImageBytesPerRecord, by column), kept for this process's later opens
// of the same source (its planning stream, its loaders, a source service), which then
// neither read those records nor load their images again. Keyed by the file (path, size,
// modification time: KeptCountKey), the columns and the image folder. Thread-safe.
struct FirstRecordsFacts {
  std::vector<std::shared_ptr<arrow::DataType>> types;
  std::map<size_t, int64_t> image_bytes;  // per column index: per record
};
class KeptFacts {
 public:
  std::optional<FirstRecordsFacts> Find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = facts_.find(key);
    if (it == facts_.end()) return std::nullopt;
    return it->second;
  }
  void Keep(const std::string& key, FirstRecordsFacts facts) {
    std::lock_guard<std::mutex> lock(mu_);
    if (facts_.size() >= 4096) facts_.clear();  // bounded: a few sources' worth
    facts_[key] = std::move(facts);
  }

 private:
  std::mutex mu_;
  std::map<std::string, FirstRecordsFacts> facts_;  // GUARDED_BY(mu_)
};
KeptFacts& FirstRecordsKept() {
  static KeptFacts* kept = new KeptFacts();  // never destroyed
  return *kept;
}

Result<FormatOpen> OpenJsonlFiles(std::shared_ptr<arrow::fs::FileSystem> fs,
                                  std::shared_ptr<FileCache> cache,
                                  const std::vector<std::string>& paths,
                                  const std::vector<arrow::fs::FileInfo>& stamps,
                                  const SourceConfig& source, const std::string& key_path,
                                  const std::vector<ColumnSpec>& columns) {
  std::vector<std::shared_ptr<arrow::DataType>> types(columns.size());
  // A user transform's columns and image fields (a path or data: URI, or a list of them:
  // JSON has no bytes) are typed by the records.
  std::vector<const ColumnSpec*> inferred;
  std::vector<bool> images(columns.size(), false);
  for (size_t i = 0; i < columns.size(); ++i) {
    const ColumnSpec& c = columns[i];
    types[i] = c.any_type ? nullptr : JsonColumnType(c);
    images[i] = !c.any_type && types[i] == nullptr && c.check(*arrow::binary()).empty();
    if (c.any_type || images[i]) {
      inferred.push_back(&c);
    } else if (types[i] == nullptr) {
      return ConfigError(c.key, "cannot be read from JSON Lines (a string, a list of "
                                "token ids, chat messages or an integer field)");
    }
  }
  std::string image_folder;  // on `fs`; "" each file's own folder
  if (!source.image_folder.empty()) {
    ARROW_ASSIGN_OR_RAISE(image_folder, FolderOn(*fs, source.image_folder,
                                                 key_path + ".image.folder"));
  }
  FormatOpen out;
  std::vector<JsonlFile> files(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    JsonlFile& f = files[i];
    f.path = paths[i];
    f.stamp = stamps[i];
    if (EndsWith(f.path, ".gz")) f.compression = arrow::Compression::GZIP;
    if (EndsWith(f.path, ".zst")) f.compression = arrow::Compression::ZSTD;
    f.image_folder = image_folder.empty() ? f.path.substr(0, f.path.rfind('/') + 1)
                                          : image_folder;
  }
  ARROW_ASSIGN_OR_RAISE(
      const std::vector<int64_t> records,
      out.AddWholeFiles(fs.get(), paths, stamps, source, "jsonl-count 1",
                        [&](size_t i, int64_t* n, int64_t* bytes, Status* damage) {
                          return CountRecords(fs.get(), cache.get(), files[i], n, bytes,
                                              damage);
                        }));
  for (size_t i = 0; i < files.size(); ++i) {  // out.files[i] is paths[i]'s
    files[i].records = std::max<int64_t>(records[i], 0);
    // A damaged file is read up to the end of its last record before the damage.
    const SourceFiles::File& f = out.files[i];
    if (!f.damaged.empty()) files[i].bytes = f.row_group_bytes.front();
  }
  if (!inferred.empty()) {
    // From the first file that holds records; with none, no record is read (and the
    // columns are typed as the first records could have them).
    std::vector<std::shared_ptr<arrow::DataType>> found;
    std::string from, facts_key;
    const JsonlFile* first = nullptr;
    std::vector<std::string> first_records;
    std::optional<FirstRecordsFacts> kept;
    for (size_t i = 0; i < files.size() && first == nullptr; ++i) {
      if (files[i].records == 0 || !out.files[i].unreadable.empty()) continue;
      first = &files[i];
      from = first->path;
      facts_key = KeptCountKey("jsonl-first 1", first->path, first->stamp);
      for (const ColumnSpec* c : inferred) {
        facts_key += '|' + std::to_string(c->name.size()) + ':' + c->name +
                     (c->any_type ? 't' : 'i');
      }
      facts_key += '|' + image_folder;
      kept = FirstRecordsKept().Find(facts_key);
      if (kept) {
        found = kept->types;
        break;
      }
      ARROW_ASSIGN_OR_RAISE(first_records, FirstRecords(fs.get(), cache.get(), *first));
      ARROW_ASSIGN_OR_RAISE(found, InferredTypes(first_records, *first, inferred));
    }
    FirstRecordsFacts facts{found, {}};
    for (size_t i = 0, k = 0; i < columns.size(); ++i) {
      if (!columns[i].any_type && !images[i]) continue;
      const ColumnSpec& c = columns[i];
      if (found.empty()) {
        types[i] = images[i] ? arrow::utf8() : arrow::null();
        continue;
      }
      types[i] = found[k++];
      std::string wrong = c.check(*types[i]);
      if (images[i]) {
        wrong = IsImageRefType(*types[i]) ? "" : "an image's path or data: URI (a "
                                                 "string), or a list of them";
      }
      if (!wrong.empty()) {
        return ConfigError(c.key, "field '" + c.name + "' is " + types[i]->ToString() +
                                      " in the first records of " + from + "; expected " +
                                      wrong);
      }
      if (images[i]) {
        // A file's records hold only where its images are; the windows (and the memory
        // a block holds) count the images too, as a Parquet row group's bytes do.
        int64_t per_record = 0;
        if (kept) {
          per_record = kept->image_bytes.at(i);
        } else {
          ARROW_ASSIGN_OR_RAISE(per_record,
                                ImageBytesPerRecord(fs.get(), cache.get(), first_records,
                                                    *first, c.name, types[i]));
        }
        facts.image_bytes[i] = per_record;
        for (size_t f = 0; f < files.size(); ++f) {
          if (out.files[f].row_group_bytes.empty()) continue;
          out.files[f].row_group_bytes.front() += files[f].records * per_record;
        }
      }
    }
    if (first != nullptr && !kept) FirstRecordsKept().Keep(facts_key, std::move(facts));
  }
  arrow::FieldVector fields;
  for (size_t i = 0; i < columns.size(); ++i) {
    fields.push_back(arrow::field(columns[i].name, types[i]));
  }
  out.reader = std::make_unique<JsonlReader>(std::move(fs), std::move(cache),
                                             std::move(files), columns,
                                             arrow::schema(fields), std::move(images),
                                             source.on_error == OnError::kSkip);
  return out;
}

}  // namespace braid::internal
