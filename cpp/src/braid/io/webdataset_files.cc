// A source's WebDataset tar shards behind SourceFiles (format_reader_internal.h:
// OpenWebDatasetFiles): `.tar` (or `.tar.gz`, `.tgz`) files read with libarchive, whose
// bytes come from an Arrow RandomAccessFile of the source's filesystem (a local file, a
// ranged GET on S3 or GCS) through libarchive's read and skip callbacks.
//
// Samples. Members are grouped as the `webdataset` package groups them: a member's key
// is its name up to the first dot of its last path component, its extension the rest,
// lowercased (`a/000123.seg.png`: key `a/000123`, extension `seg.png`); consecutive
// members with one key are one sample; names without such a dot, `__...__` metadata
// members and entries that are not regular files are passed over. Two members of one
// extension in a sample are a data error. A sample is a row; a column names a member:
//   EXT         its bytes: a binary column (images), a string (text; UTF-8 checked) or an
//               integer (`cls`: decimal text), whichever the transform reads
//   A;B;C       alternatives: the first of them the sample has (`jpg;png;webp`)
//   json        a JSON member parsed whole (Arrow's JSON reader), e.g. a list of ids;
//               for a user transform, its bytes, as any member's
//   EXT:FIELD   a field of a JSON member (`json:input_ids`, `json:messages`)
//
// Units. A tar has no index, so a shard is one unit (the shuffle unit, like a JSON Lines
// file: shards are permuted, and a shard larger than the source's shuffle_window_bytes is
// read in consecutive blocks of samples); a position inside it is (shard, sample). A
// unit's bytes are the span of its samples in the tar (first sample's first header to
// the archive's end). Opening a source counts every shard's samples: from the
// Megatron-Energon index of its folder when it has one that agrees with the shard
// (webdataset_index_internal.h; no member header is read), else by reading its member
// headers once (member data is skipped: a seek, no read, in an uncompressed tar;
// several shards side by side, FormatOpen::AddWholeFiles);
// runtime.length_cache keeps those counts (keyed by the path, size, modification time
// and the extensions read). A block is read by a stream that stays open, so a shard's
// blocks read in order read it once; a block behind it (a resume) reopens the shard and
// skips the samples before, or, with the index, enters it at the offset of the sample
// before the block and checks every sample read against the index. A shard whose index
// disagrees with it is read from its headers from then on (a warning naming it), or is a
// data error naming it and its index when its headers give other counts than the plan's.
//
// Errors. A failed read of the underlying file is a storage error (retried by
// SourceFiles); a shard that is not a readable tar (truncated, a bad header checksum, not
// gzip) is a data error naming it: at open, an unreadable shard under on_error: skip,
// or, when whole samples came before the damage (a shard cut short), those samples.
// A sample without a member a column reads, a member that is not valid UTF-8, a decimal
// integer or JSON of the expected shape, is a data error naming the shard, the sample's
// key and row and the member under on_error: fail, and a null (a counted skip of that
// sample) under skip.
//
// Thread-compatible (format_reader_internal.h).
#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <optional>
#include <set>

#include <arrow/api.h>
#include <arrow/io/api.h>
#include <arrow/json/api.h>
#include <arrow/util/utf8.h>

#include "braid/io/format_reader_internal.h"
#include "braid/io/read_memory.h"
#include "braid/io/source_files_internal.h"
#include "braid/io/webdataset_index_internal.h"
#include "braid/util/log_internal.h"

namespace braid::internal {
namespace {

constexpr int64_t kReadChunkBytes = int64_t{1} << 20;

// A tar archive read member by member from an Arrow file. Not copyable.
class TarStream {
 public:
  TarStream(const TarStream&) = delete;
  TarStream& operator=(const TarStream&) = delete;
  ~TarStream() {
    if (archive_ != nullptr) archive_read_free(archive_);
  }

  /// The archive of `path` from byte `offset` on (a member header's; only in an
  /// uncompressed tar), or from its start.
  static Result<std::unique_ptr<TarStream>> Open(arrow::fs::FileSystem* fs,
                                                 const std::string& path,
                                                 int64_t offset = 0) {
    std::unique_ptr<TarStream> t(new TarStream(path));
    auto file = fs->OpenInputFile(path);
    if (!file.ok()) return StorageError(path, OneLine(file.status().message()));
    t->file_ = std::move(*file);
    auto size = t->file_->GetSize();
    if (!size.ok()) return StorageError(path, OneLine(size.status().message()));
    t->size_ = *size;
    t->base_ = t->pos_ = std::min(offset, t->size_);
    t->archive_ = archive_read_new();
    if (t->archive_ == nullptr) return Status::OutOfMemory("libarchive");
    archive_read_support_format_tar(t->archive_);
    archive_read_support_filter_gzip(t->archive_);
    if (archive_read_open2(t->archive_, t.get(), nullptr, &TarStream::ReadCallback,
                           &TarStream::SkipCallback, nullptr) != ARCHIVE_OK) {
      return t->Error("cannot open");
    }
    return t;
  }

  /// The next regular member's name and size; false at the end of the archive.
  Result<bool> Next(std::string* name, int64_t* size) {
    while (true) {
      archive_entry* entry = nullptr;
      const int r = archive_read_next_header(archive_, &entry);
      header_ = base_ + archive_read_header_position(archive_);
      if (r == ARCHIVE_EOF) return false;
      if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
        return Error("cannot read a member header");
      }
      ++members_;
      if (archive_entry_filetype(entry) != AE_IFREG) continue;
      const char* n = archive_entry_pathname(entry);
      if (n == nullptr) n = archive_entry_pathname_utf8(entry);
      if (n == nullptr) continue;
      *name = n;
      *size = archive_entry_size(entry);
      return true;
    }
  }

  /// The bytes of the member Next returned last (`size` of them).
  Status Read(int64_t size, std::string* out) {
    out->resize(size_t(size));
    int64_t got = 0;
    while (got < size) {
      const la_ssize_t n =
          archive_read_data(archive_, out->data() + got, size_t(size - got));
      if (n < 0) return Error("cannot read a member");
      if (n == 0) return Error("a member ends early");
      got += n;
    }
    return Status::OK();
  }

  /// Members read so far (every entry, for messages).
  int64_t members() const { return members_; }

  /// Where the header Next read last starts (an extended header's, if it has one), or,
  /// after Next returned false, where the archive's end-of-archive blocks (or its bytes)
  /// end: a byte of the uncompressed tar.
  int64_t header() const { return header_; }

 private:
  explicit TarStream(std::string path) : path_(std::move(path)) {}

  static la_ssize_t ReadCallback(archive* a, void* self_ptr, const void** buffer) {
    auto* self = static_cast<TarStream*>(self_ptr);
    if (self->pos_ >= self->size_) return 0;
    const int64_t want = std::min(kReadChunkBytes, self->size_ - self->pos_);
    auto chunk = self->file_->ReadAt(self->pos_, want);
    if (!chunk.ok()) {
      self->io_error_ = chunk.status();
      archive_set_error(a, EIO, "%s", chunk.status().message().c_str());
      return ARCHIVE_FATAL;
    }
    self->chunk_ = std::move(*chunk);
    self->pos_ += self->chunk_->size();
    *buffer = self->chunk_->data();
    return static_cast<la_ssize_t>(self->chunk_->size());
  }

  // Skips forward without reading (libarchive calls it for member data it does not
  // need, in an uncompressed tar).
  static la_int64_t SkipCallback(archive*, void* self_ptr, la_int64_t request) {
    auto* self = static_cast<TarStream*>(self_ptr);
    const int64_t n =
        std::max<int64_t>(0, std::min<int64_t>(request, self->size_ - self->pos_));
    self->pos_ += n;
    return n;
  }

  Status Error(const std::string& what) {
    if (!io_error_.ok()) {
      return StorageError(path_, what + ": " + OneLine(io_error_.message()));
    }
    const char* why = archive_error_string(archive_);
    return DataError(path_, "not a readable tar (" + what + " after " +
                                std::to_string(members_) + " members: " +
                                (why != nullptr ? why : "unknown error") + ")");
  }

  std::string path_;
  std::shared_ptr<arrow::io::RandomAccessFile> file_;
  int64_t size_ = 0;
  int64_t base_ = 0;  // where the archive was entered
  int64_t pos_ = 0;  // the next byte the read callback reads
  int64_t header_ = 0;
  std::shared_ptr<arrow::Buffer> chunk_;  // what libarchive reads now
  Status io_error_;  // a failed read of file_ (the storage's failure)
  int64_t members_ = 0;
  archive* archive_ = nullptr;
};

// webdataset's base_plus_ext: the key is the name up to the first dot of its last path
// component (which must not start with it), the extension the rest, lowercased; false
// for a name without such a dot.
bool SplitName(const std::string& name, std::string* key, std::string* ext) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string::npos || dot == base) return false;
  *key = name.substr(0, dot);
  *ext = name.substr(dot + 1);
  std::transform(ext->begin(), ext->end(), ext->begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return true;
}

// webdataset's skip_meta (`__[^/]*__($|/)` at the name's start): metadata members.
bool IsMetaName(const std::string& name) {
  if (name.size() < 4 || name.compare(0, 2, "__") != 0) return false;
  const size_t slash = name.find('/');
  const std::string head = name.substr(0, slash);
  return head.size() >= 4 && head.compare(head.size() - 2, 2, "__") == 0;
}

// One sample: its key and the members read (data only for the extensions wanted).
struct Sample {
  std::string key;
  int64_t start = 0;  // its first member's header (TarStream::header)
  std::vector<std::string> extensions;  // every member's, in the tar's order
  std::vector<std::pair<std::string, std::string>> data;  // (extension, bytes) wanted
  int64_t wanted_bytes = 0;  // the sizes of the members wanted
  const std::string* Member(const std::string& ext) const {
    for (const auto& [e, bytes] : data) {
      if (e == ext) return &bytes;
    }
    return nullptr;
  }
  std::string ExtensionList() const {
    std::string s;
    for (const auto& e : extensions) s += (s.empty() ? "" : ", ") + e;
    return s;
  }
};

// The samples of one shard in order.
class SampleStream {
 public:
  SampleStream(std::unique_ptr<TarStream> tar, const std::set<std::string>* wanted,
               std::string path)
      : tar_(std::move(tar)), wanted_(wanted), path_(std::move(path)) {}

  /// The next sample; false at the end of the shard. With `read` false no data is read.
  Result<bool> Next(bool read, Sample* out) {
    out->key.clear();
    out->extensions.clear();
    out->data.clear();
    out->wanted_bytes = 0;
    if (done_) return false;
    while (true) {
      if (!pending_) {
        ARROW_ASSIGN_OR_RAISE(const bool more, tar_->Next(&name_, &size_));
        if (!more) {
          done_ = true;
          break;
        }
        if (IsMetaName(name_) || !SplitName(name_, &key_, &ext_)) continue;
        header_ = tar_->header();
      }
      if (!out->key.empty() && key_ != out->key) {
        pending_ = true;  // the next sample's first member (its data not read yet)
        return true;
      }
      pending_ = false;
      if (out->key.empty()) {
        out->key = key_;
        out->start = header_;
      }
      if (std::find(out->extensions.begin(), out->extensions.end(), ext_) !=
          out->extensions.end()) {
        return DataError(path_, "sample '" + out->key + "' has two members '" + name_ +
                                    "' (extension '" + ext_ + "')");
      }
      out->extensions.push_back(ext_);
      if (wanted_->count(ext_) > 0) {
        out->wanted_bytes += size_;
        if (read) {
          out->data.emplace_back(ext_, std::string());
          ARROW_RETURN_NOT_OK(tar_->Read(size_, &out->data.back().second));
        }
      }
    }
    return !out->key.empty();
  }

  /// Where the sample after the last one Next returned starts, or, at the end of the
  /// shard, where its archive ends (TarStream::header). REQUIRES: Next returned a sample.
  int64_t next_start() const { return pending_ ? header_ : tar_->header(); }

 private:
  std::unique_ptr<TarStream> tar_;
  const std::set<std::string>* wanted_;
  std::string path_;
  bool pending_ = false;  // name_, key_, ext_, size_: a member read but not yet taken
  bool done_ = false;
  std::string name_, key_, ext_;
  int64_t size_ = 0;
  int64_t header_ = 0;  // where the member name_ starts
};

// The samples of one shard, from its member headers, and the bytes they span in the tar
// (from the first sample's first header to the archive's end: what an Energon index's
// offsets give, so a shard's units are the same with and without one).
Status CountSamples(arrow::fs::FileSystem* fs, const std::string& path, int64_t* samples,
                    int64_t* bytes, Status* damage) {
  *samples = 0;
  *bytes = 0;
  ARROW_ASSIGN_OR_RAISE(auto tar, TarStream::Open(fs, path));
  const std::set<std::string> none;
  SampleStream stream(std::move(tar), &none, path);
  Sample s;
  int64_t start = 0;
  while (true) {
    auto next = stream.Next(/*read=*/false, &s);
    if (!next.ok() && !next.status().IsIOError() && *samples > 0) {
      // Bad bytes after whole samples (a shard cut short): those samples, up to the
      // header that ended the last of them, and the damage.
      *damage = next.status().WithMessage(next.status().message(), " (after ",
                                          *samples, " samples)");
      return Status::OK();
    }
    ARROW_ASSIGN_OR_RAISE(const bool more, std::move(next));
    if (!more) break;
    if (++*samples == 1) start = s.start;
    *bytes = stream.next_start() - start;
  }
  return Status::OK();
}

// A column of the source: the member(s) it reads and how.
struct MemberColumn {
  std::string name;  // as the config gave it
  std::string key;   // its config key
  std::vector<std::string> extensions;  // alternatives: the first a sample has
  std::string field;                    // of a JSON member; "" the whole member
  bool json = false;
  // A user transform's field of a JSON member: typed by the source's first samples
  // (FirstSamplesTypes), as a JSON Lines field is.
  bool inferred = false;
  std::shared_ptr<arrow::DataType> type;
};

Result<MemberColumn> ColumnOf(const ColumnSpec& spec) {
  MemberColumn c;
  c.name = spec.name;
  c.key = spec.key;
  std::string members = spec.name;
  const size_t colon = members.find(':');
  if (colon != std::string::npos) {
    c.field = members.substr(colon + 1);
    members = members.substr(0, colon);
    c.json = true;
    if (c.field.empty()) return ConfigError(spec.key, "names no field after ':'");
  }
  size_t at = 0;
  while (at <= members.size()) {
    const size_t end = std::min(members.find(';', at), members.size());
    std::string ext = members.substr(at, end - at);
    std::transform(ext.begin(), ext.end(), ext.begin(),
                   [](unsigned char ch) { return char(std::tolower(ch)); });
    if (!ext.empty() && ext.front() == '.') ext.erase(0, 1);
    if (ext.empty()) {
      return ConfigError(spec.key, "'" + spec.name + "' names an empty member extension");
    }
    c.extensions.push_back(std::move(ext));
    at = end + 1;
  }
  // A whole JSON member is parsed, but for a column that takes bytes (a user transform's:
  // the function gets the member's bytes, as the webdataset package gives them).
  if (!c.json && !spec.check(*arrow::binary()).empty()) {
    c.json = std::all_of(c.extensions.begin(), c.extensions.end(), [](const auto& e) {
      return e == "json" || (e.size() > 5 && e.compare(e.size() - 5, 5, ".json") == 0);
    });
  }
  if (c.json && spec.any_type && !c.field.empty()) {
    c.inferred = true;  // its type comes from the first samples
    return c;
  }
  if (c.json) {
    c.type = JsonColumnType(spec);
  } else {
    for (const auto& t : {arrow::binary(), arrow::utf8(), arrow::int64()}) {
      if (spec.check(*t).empty()) {
        c.type = t;
        break;
      }
    }
  }
  if (c.type == nullptr) {
    return ConfigError(spec.key,
                       "cannot be read from WebDataset member '" + spec.name +
                           "' (a member is read as bytes, a string or a decimal integer; "
                           "a token list or chat messages come from a JSON member or a "
                           "field of one: json, json:FIELD)");
  }
  return c;
}

struct TarFile {
  std::string path;
  int64_t samples = 0;
  int64_t bytes = 0;  // the span of its samples (CountSamples)
  // With an Energon index: where it is and what it lists (the reader drops it when the
  // shard disagrees with it).
  std::optional<ShardIndex> index;
};

class WebDatasetReader : public FormatReader {
 public:
  WebDatasetReader(std::shared_ptr<arrow::fs::FileSystem> fs, std::vector<TarFile> files,
                   std::vector<MemberColumn> columns, std::set<std::string> wanted,
                   bool skip)
      : fs_(std::move(fs)),
        files_(std::move(files)),
        columns_(std::move(columns)),
        wanted_(std::move(wanted)),
        skip_(skip) {}

  Result<Columns> ReadColumns(int file, int unit) override {
    ARROW_ASSIGN_OR_RAISE(auto chunks,
                          ReadRows(file, unit, 0, files_[size_t(file)].samples));
    return std::move(chunks.front());
  }

  // A token source's counts: its lists' lengths (the members are read: JSON has no way
  // to skip a list's values).
  Result<std::vector<RowLength>> ReadLengths(int file, int unit) override {
    ARROW_ASSIGN_OR_RAISE(auto cols, ReadColumns(file, unit));
    return ListLengths(*cols.front());
  }
  // A block's counts from its own records: not the whole shard's.
  Result<std::optional<std::vector<RowLength>>> ReadRowLengths(int file, int unit,
                                                               int64_t first,
                                                               int64_t rows) override {
    return ListLengthsOfRows(this, file, unit, first, rows);
  }

  Result<std::vector<Columns>> ReadRows(int file, int unit, int64_t first,
                                        int64_t rows) override {
    TarFile& f = files_[size_t(file)];
    // With an index, a block that the open stream is not at is entered at the offset of
    // the sample before its first (no pass over the samples before that), and each
    // sample read is checked to start where the index says, so the block's first sample
    // is a whole one (a new key at that offset); a block that disagrees is read again
    // without the index.
    std::vector<int64_t> offsets;  // of samples first - 1 .. first + rows, when entered
    const bool at_first = file_ == file && stream_ != nullptr && next_ == first;
    if (!at_first && first > 0 && rows > 0 && f.index.has_value()) {
      ARROW_ASSIGN_OR_RAISE(std::string problem, Enter(f, file, first, rows, &offsets));
      if (!problem.empty()) {
        ARROW_RETURN_NOT_OK(DropIndex(f, problem));
        return ReadRows(file, unit, first, rows);
      }
    } else if (file_ != file || stream_ == nullptr || next_ > first) {
      stream_.reset();
      ARROW_ASSIGN_OR_RAISE(auto tar, TarStream::Open(fs_.get(), f.path));
      stream_ = std::make_unique<SampleStream>(std::move(tar), &wanted_, f.path);
      file_ = file;
      next_ = 0;
    }
    std::vector<Sample> samples(size_t(std::max<int64_t>(rows, 0)));
    Sample passed;
    while (next_ < first + rows) {
      const bool keep = next_ >= first;
      Sample* s = keep ? &samples[size_t(next_ - first)] : &passed;
      auto more = stream_->Next(/*read=*/keep, s);
      std::string problem;  // entered at an offset: where the shard disagrees with it
      if (!offsets.empty()) {
        const int64_t want = offsets[size_t(next_ - first + 1)];
        if (!more.ok() && !more.status().IsIOError()) {
          problem = "reading it from offset " + std::to_string(offsets.front()) +
                    " failed: " + more.status().message();
        } else if (more.ok() && !*more) {
          problem = "no sample " + std::to_string(next_) + " at offset " +
                    std::to_string(want);
        } else if (more.ok() && s->start != want) {
          problem = "sample " + std::to_string(next_) + " ('" + s->key +
                    "') starts at offset " + std::to_string(s->start) + ", not " +
                    std::to_string(want);
        } else if (more.ok() && next_ + 1 == first + rows &&
                   stream_->next_start() != offsets.back()) {
          problem = "sample " + std::to_string(next_) + " ('" + s->key + "') ends at " +
                    std::to_string(stream_->next_start()) + ", not " +
                    std::to_string(offsets.back());
        }
      }
      if (!problem.empty()) {
        ARROW_RETURN_NOT_OK(DropIndex(f, problem));
        return ReadRows(file, unit, first, rows);
      }
      if (!more.ok() || !*more) {
        stream_.reset();
        file_ = -1;
        if (!more.ok()) return more.status();
        return DataError(f.path, "has " + std::to_string(next_) +
                                     " samples where opening counted " +
                                     std::to_string(f.samples) + " (changed?)");
      }
      ++next_;
    }
    Columns out;
    for (const auto& c : columns_) {
      ARROW_ASSIGN_OR_RAISE(auto array, Build(f, c, samples, first));
      out.push_back(std::move(array));
    }
    return std::vector<Columns>{std::move(out)};
  }

 private:
  // Opens shard `file` (`f`) at sample `first` - 1 of its index, whose offsets of
  // samples first - 1 .. first + rows it sets; "" or what disagreed. REQUIRES: first > 0.
  Result<std::string> Enter(const TarFile& f, int file, int64_t first, int64_t rows,
                            std::vector<int64_t>* offsets) {
    stream_.reset();
    file_ = -1;
    if (idx_ == nullptr || idx_file_ != file) {
      idx_.reset();
      auto info = fs_->GetFileInfo(f.index->idx);
      if (!info.ok()) return StorageError(f.index->idx, OneLine(info.status().message()));
      if (!info->IsFile()) return std::string("it has no ") + f.index->idx;
      auto opened = fs_->OpenInputFile(*info);
      if (!opened.ok()) {
        return StorageError(f.index->idx, OneLine(opened.status().message()));
      }
      idx_ = std::move(*opened);
      idx_file_ = file;
    }
    ARROW_ASSIGN_OR_RAISE(std::string problem,
                          ReadSampleOffsets(idx_.get(), f.index->idx, f.samples,
                                            first - 1, rows + 1, offsets));
    if (!problem.empty()) return f.index->idx + ": " + problem;
    auto tar = TarStream::Open(fs_.get(), f.path, offsets->front());
    if (!tar.ok()) {
      if (tar.status().IsIOError()) return tar.status();
      return "reading it from offset " + std::to_string(offsets->front()) +
             " failed: " + tar.status().message();
    }
    stream_ = std::make_unique<SampleStream>(std::move(*tar), &wanted_, f.path);
    file_ = file;
    next_ = first - 1;
    return std::string();
  }

  // The shard `f` disagrees with its index (`problem`): says so, and reads it without
  // the index from now on if its member headers give the samples and bytes that opening
  // took from the index (the plan's units); else that is a data error naming the shard
  // and its index.
  Status DropIndex(TarFile& f, const std::string& problem) {
    stream_.reset();
    file_ = -1;
    idx_.reset();
    LogLine(f.path + ": its Energon index (" + f.index->info + ") disagrees with it: " +
            problem + "; reading it from its member headers");
    int64_t samples = 0, bytes = 0;
    Status damage;
    ARROW_RETURN_NOT_OK(CountSamples(fs_.get(), f.path, &samples, &bytes, &damage));
    ARROW_RETURN_NOT_OK(damage);  // the index promised whole samples past it
    if (samples != f.samples || bytes != f.bytes) {
      return DataError(f.path, "has " + std::to_string(samples) + " samples spanning " +
                                   std::to_string(bytes) + " bytes where opening took " +
                                   std::to_string(f.samples) + " samples spanning " +
                                   std::to_string(f.bytes) + " bytes from its Energon " +
                                   "index (" + f.index->idx + ", " + f.index->info +
                                   "; a stale index: run energon prepare again)");
    }
    f.index.reset();
    return Status::OK();
  }

  // "sample 'KEY' (row R)".
  static std::string Where(const Sample& s, int64_t row) {
    return "sample '" + s.key + "' (row " + std::to_string(row) + ")";
  }

  // The member of `c` that `s` has (the first of the alternatives), or null: under
  // on_error: fail its absence is an error naming the sample, else a null row.
  Result<const std::string*> MemberOf(const TarFile& f, const MemberColumn& c,
                                      const Sample& s, int64_t row, std::string* ext) {
    for (const auto& e : c.extensions) {
      if (const std::string* bytes = s.Member(e)) {
        *ext = e;
        return bytes;
      }
    }
    if (skip_) return nullptr;
    return DataError(f.path, Where(s, row) + ": no member '" + c.extensions.front() +
                                 "'" +
                                 (c.extensions.size() > 1
                                      ? " (nor any of '" + c.name + "')"
                                      : std::string()) +
                                 " for " + c.key + "; its members: " + s.ExtensionList());
  }

  Result<std::shared_ptr<arrow::Array>> Build(const TarFile& f, const MemberColumn& c,
                                              const std::vector<Sample>& samples,
                                              int64_t first) {
    if (c.json) return BuildJson(f, c, samples, first);
    std::unique_ptr<arrow::ArrayBuilder> builder;
    ARROW_RETURN_NOT_OK(arrow::MakeBuilder(ReadMemoryPool(), c.type, &builder));
    for (size_t i = 0; i < samples.size(); ++i) {
      const int64_t row = first + int64_t(i);
      std::string ext;
      ARROW_ASSIGN_OR_RAISE(const std::string* bytes,
                            MemberOf(f, c, samples[i], row, &ext));
      std::string bad;
      if (bytes == nullptr) {
        ARROW_RETURN_NOT_OK(builder->AppendNull());
        continue;
      }
      if (c.type->id() == arrow::Type::BINARY) {
        ARROW_RETURN_NOT_OK(static_cast<arrow::BinaryBuilder&>(*builder).Append(*bytes));
        continue;
      }
      if (c.type->id() == arrow::Type::STRING) {
        if (arrow::util::ValidateUTF8(reinterpret_cast<const uint8_t*>(bytes->data()),
                                      int64_t(bytes->size()))) {
          ARROW_RETURN_NOT_OK(
              static_cast<arrow::StringBuilder&>(*builder).Append(*bytes));
          continue;
        }
        bad = "is not valid UTF-8 text";
      } else {  // int64: decimal text, as webdataset writes `.cls`
        const char* b = bytes->data();
        const char* e = b + bytes->size();
        while (b < e && std::isspace(static_cast<unsigned char>(*b))) ++b;
        while (e > b && std::isspace(static_cast<unsigned char>(e[-1]))) --e;
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(b, e, v);
        if (ec == std::errc() && end == e && b < e) {
          ARROW_RETURN_NOT_OK(static_cast<arrow::Int64Builder&>(*builder).Append(v));
          continue;
        }
        bad = "is not a decimal integer";
      }
      if (!skip_) {
        return DataError(f.path, Where(samples[i], row) + ": member '" + ext + "' (" +
                                     c.key + ") " + bad);
      }
      ARROW_RETURN_NOT_OK(builder->AppendNull());
    }
    std::shared_ptr<arrow::Array> out;
    ARROW_RETURN_NOT_OK(builder->Finish(&out));
    return out;
  }

  // Parses `lines` (one `{"v": MEMBER}` object each) under `c`'s schema: the column.
  Result<std::shared_ptr<arrow::Array>> ParseJson(const MemberColumn& c,
                                                  const std::string& lines) {
    auto type = c.field.empty()
                    ? c.type
                    : arrow::struct_({arrow::field(c.field, c.type)});
    auto read_options = arrow::json::ReadOptions::Defaults();
    read_options.use_threads = false;
    read_options.block_size = int32_t(std::clamp<int64_t>(int64_t(lines.size()) + 1,
                                                          int64_t{1} << 20,
                                                          int64_t{1} << 30));
    auto parse_options = arrow::json::ParseOptions::Defaults();
    parse_options.explicit_schema = arrow::schema({arrow::field("v", type)});
    parse_options.unexpected_field_behavior =
        arrow::json::UnexpectedFieldBehavior::Ignore;
    parse_options.newlines_in_values = true;
    auto input =
        std::make_shared<arrow::io::BufferReader>(arrow::Buffer::FromString(lines));
    ARROW_ASSIGN_OR_RAISE(auto reader,
                          arrow::json::TableReader::Make(ReadMemoryPool(), input,
                                                         read_options, parse_options));
    ARROW_ASSIGN_OR_RAISE(auto table, reader->Read());
    auto column = table->GetColumnByName("v");
    if (column == nullptr) return Status::Invalid("no value parsed");
    std::shared_ptr<arrow::Array> v;
    if (column->num_chunks() == 1) {
      v = column->chunk(0);
    } else {
      ARROW_ASSIGN_OR_RAISE(v, arrow::Concatenate(column->chunks(), ReadMemoryPool()));
    }
    if (c.field.empty()) return v;
    return static_cast<const arrow::StructArray&>(*v).GetFlattenedField(0,
                                                                        ReadMemoryPool());
  }

  Result<std::shared_ptr<arrow::Array>> BuildJson(const TarFile& f, const MemberColumn& c,
                                                  const std::vector<Sample>& samples,
                                                  int64_t first) {
    std::vector<const std::string*> members(samples.size());
    std::vector<std::string> exts(samples.size());
    for (size_t i = 0; i < samples.size(); ++i) {
      ARROW_ASSIGN_OR_RAISE(members[i],
                            MemberOf(f, c, samples[i], first + int64_t(i), &exts[i]));
    }
    auto line = [&](size_t i) {
      return members[i] == nullptr ? std::string("{}\n")
                                   : "{\"v\":" + *members[i] + "\n}\n";
    };
    std::string lines;
    for (size_t i = 0; i < samples.size(); ++i) lines += line(i);
    auto parsed = ParseJson(c, lines);
    if (!parsed.ok()) {
      // Which sample: each alone (the cost of an error only). Under skip a bad member is
      // a null row and the rest are parsed again.
      lines.clear();
      for (size_t i = 0; i < samples.size(); ++i) {
        if (members[i] != nullptr) {
          auto one = ParseJson(c, line(i));
          if (!one.ok() || (*one)->length() != 1) {
            if (!skip_) {
              return DataError(
                  f.path, Where(samples[i], first + int64_t(i)) + ": member '" + exts[i] +
                              "' (" + c.key + ") is not JSON of the expected shape: " +
                              (one.ok() ? std::string("not one value")
                                        : OneLine(one.status().message())));
            }
            members[i] = nullptr;
          }
        }
        lines += line(i);
      }
      parsed = ParseJson(c, lines);
      if (!parsed.ok()) {
        return DataError(f.path, "samples " + std::to_string(first) + ".." +
                                     std::to_string(first + int64_t(samples.size())) +
                                     ": " + OneLine(parsed.status().message()));
      }
    }
    const auto& array = *parsed;
    if (array->length() != int64_t(samples.size())) {
      return DataError(f.path, "samples " + std::to_string(first) + ": parsed " +
                                   std::to_string(array->length()) + " JSON values for " +
                                   std::to_string(samples.size()) + " samples");
    }
    if (!skip_ && array->null_count() > 0) {
      for (size_t i = 0; i < samples.size(); ++i) {
        if (array->IsNull(int64_t(i))) {
          return DataError(f.path, Where(samples[i], first + int64_t(i)) + ": member '" +
                                       exts[i] + "' (" + c.key + ") " +
                                       (c.field.empty() ? std::string("is null")
                                                        : "has no field '" + c.field +
                                                              "' (or it is null)"));
        }
      }
    }
    return array;
  }

  std::shared_ptr<arrow::fs::FileSystem> fs_;
  std::vector<TarFile> files_;
  std::vector<MemberColumn> columns_;
  std::set<std::string> wanted_;  // every extension a column reads
  bool skip_ = false;
  // The open stream: shard file_, samples [0, next_) read or passed.
  int file_ = -1;
  int64_t next_ = 0;
  std::unique_ptr<SampleStream> stream_;
  // The open .tar.idx, of shard idx_file_.
  int idx_file_ = -1;
  std::shared_ptr<arrow::io::RandomAccessFile> idx_;
};

// The types of `columns`' inferred fields (MemberColumn::inferred), from the JSON members
// of the first samples (at most 1,000) of the first shard in path order that has any,
// each typed alone and unified (TypeOfFields), held for every sample of the source.
Status FirstSamplesTypes(arrow::fs::FileSystem* fs, const std::vector<TarFile>& files,
                         std::vector<MemberColumn>* columns) {
  constexpr int64_t kFirstSamples = 1000;
  std::set<std::string> wanted;
  std::vector<std::pair<std::string, std::string>> fields;
  for (const MemberColumn& c : *columns) {
    if (!c.inferred) continue;
    wanted.insert(c.extensions.begin(), c.extensions.end());
    fields.emplace_back(c.field, c.key);
  }
  if (fields.empty()) return Status::OK();
  const TarFile* first = nullptr;
  for (const TarFile& f : files) {
    if (f.samples > 0) {
      first = &f;
      break;
    }
  }
  if (first == nullptr) {  // no sample to read: nothing is read under any type
    for (MemberColumn& c : *columns) {
      if (c.inferred) c.type = arrow::null();
    }
    return Status::OK();
  }
  // One record per (sample, column): {"FIELD": ...} as the member holds it.
  std::vector<std::vector<std::string>> records(columns->size());
  ARROW_ASSIGN_OR_RAISE(auto tar, TarStream::Open(fs, first->path));
  SampleStream stream(std::move(tar), &wanted, first->path);
  Sample s;
  for (int64_t i = 0; i < std::min(first->samples, kFirstSamples); ++i) {
    ARROW_ASSIGN_OR_RAISE(const bool more, stream.Next(/*read=*/true, &s));
    if (!more) break;
    for (size_t k = 0; k < columns->size(); ++k) {
      const MemberColumn& c = (*columns)[k];
      if (!c.inferred) continue;
      for (const auto& e : c.extensions) {
        if (const std::string* member = s.Member(e)) {
          records[k].push_back(*member);
          break;
        }
      }
    }
  }
  for (size_t k = 0; k < columns->size(); ++k) {
    MemberColumn& c = (*columns)[k];
    if (!c.inferred) continue;
    ARROW_ASSIGN_OR_RAISE(
        auto types,
        TypeOfFields(records[k], first->path, {{c.field, c.key}},
                     "a WebDataset source gives a transform's field of a JSON member the "
                     "type its first shard's first samples (1,000) have, and holds it"));
    c.type = types.front();
  }
  return Status::OK();
}

}  // namespace

Result<FormatOpen> OpenWebDatasetFiles(std::shared_ptr<arrow::fs::FileSystem> fs,
                                       const std::vector<std::string>& paths,
                                       const std::vector<arrow::fs::FileInfo>& stamps,
                                       const SourceConfig& source,
                                       const std::string& /*key_path*/,
                                       const std::vector<ColumnSpec>& columns) {
  std::vector<MemberColumn> members;
  std::set<std::string> wanted;
  std::string tag = "webdataset-count 2";
  for (const auto& spec : columns) {
    ARROW_ASSIGN_OR_RAISE(auto c, ColumnOf(spec));
    for (const auto& e : c.extensions) {
      wanted.insert(e);
    }
    members.push_back(std::move(c));
  }
  for (const auto& e : wanted) tag += ' ' + e;
  FormatOpen out;
  const bool skip = source.on_error == OnError::kSkip;
  ARROW_ASSIGN_OR_RAISE(ShardIndexes indexes, RetryStorage([&] {
                          return FindShardIndexes(fs.get(), paths,
                                                  IndexSearchRoot(source.path));
                        }));
  for (const auto& problem : indexes.problems) LogLine(problem);
  std::vector<TarFile> files(paths.size());
  // An index that disagrees with its shard, said after the counts, in path order.
  std::vector<std::string> stale(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    files[i].path = paths[i];
    files[i].index = std::move(indexes.shards[i]);
  }
  ARROW_ASSIGN_OR_RAISE(
      const std::vector<int64_t> samples,
      out.AddWholeFiles(
          fs.get(), paths, stamps, source, tag,
          [&](size_t i, int64_t* n, int64_t* bytes, Status* damage) -> Status {
            TarFile& f = files[i];
            if (f.index.has_value()) {
              ARROW_ASSIGN_OR_RAISE(const std::string problem,
                                    CheckShardIndex(fs.get(), f.path, *f.index, bytes));
              if (problem.empty()) {
                *n = f.index->samples;
                return Status::OK();
              }
              stale[i] = f.path + ": its Energon index (" + f.index->info +
                         ") disagrees with it: " + problem +
                         "; counting its member headers instead";
              f.index.reset();
            }
            return CountSamples(fs.get(), f.path, n, bytes, damage);
          }));
  for (size_t i = 0; i < files.size(); ++i) {  // out.files[i] is paths[i]'s
    if (!stale[i].empty()) LogLine(stale[i]);
    TarFile& f = files[i];
    f.samples = std::max<int64_t>(samples[i], 0);
    if (samples[i] < 0) f.index.reset();  // kept as unreadable
    f.bytes = samples[i] < 0 ? 0 : out.files[i].row_group_bytes.front();
  }
  ARROW_RETURN_NOT_OK(RetryStorage([&] { return FirstSamplesTypes(fs.get(), files,
                                                                   &members); }));
  out.reader = std::make_unique<WebDatasetReader>(std::move(fs), std::move(files),
                                                  std::move(members), std::move(wanted),
                                                  skip);
  return out;
}

Result<std::vector<std::string>> WebDatasetExtensions(arrow::fs::FileSystem* fs,
                                                      const std::string& path,
                                                      int64_t samples) {
  ARROW_ASSIGN_OR_RAISE(auto tar, TarStream::Open(fs, path));
  const std::set<std::string> none;
  SampleStream stream(std::move(tar), &none, path);
  std::vector<std::string> out;
  Sample s;
  for (int64_t i = 0; i < samples; ++i) {
    ARROW_ASSIGN_OR_RAISE(const bool more, stream.Next(/*read=*/false, &s));
    if (!more) break;
    for (const auto& e : s.extensions) {
      if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
    }
  }
  return out;
}

}  // namespace braid::internal
