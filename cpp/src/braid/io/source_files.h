// The files of one source: path resolution, footers, and row-group reads.
//
// SourceFiles resolves a source's `path` (a file, a directory of Parquet files, or a
// glob; local or any URI Arrow's filesystems accept, with the source's storage options)
// to a sorted list of files, reads every footer once, checks the type of each column the
// source's transform reads (a token list, or text / chat columns) in each file, and reads
// those columns of one row group on request. Errors name the file (and row group), the
// column and its config key. With runtime.cache, remote files are read from local copies
// (FileCache): a file is copied when its rows are first read, and its copy stays pinned
// while the reader of that file is open.
//
// Unreadable files. A storage failure (the file vanished, the server stopped answering,
// a read failed half-way; not a refusal of access) is retried with backoff
// (io/retry_internal.h: 4 tries, 50 / 200 / 800 ms); a Parquet file whose bytes are bad
// (truncated, bad footer, corrupt page) is not. With the source's on_error: skip, a
// file whose footer cannot be read is kept in the list with no row groups and its
// reason in File::unreadable (so file indexes keep meaning "index in sorted path order"
// and the order is a pure function of which footers read, docs/decisions.md 22), and a
// file whose reads keep failing after retries is lost for the rest of the run (later
// reads of it fail at once with the same error). With on_error: fail, both are errors
// naming the file.
//
// Files that change. Each file (a Megatron dataset: its .idx and its .bin) is stamped
// with its size and modification time before its footer or index is read, and every read
// (ReadColumns, ReadBlock, ReadLengths) stats it again after it returns: a file rewritten
// in place, replaced or truncated since the stamp is a data error naming it ("changed
// since the source opened it"), never read further (lost, as above; under on_error: skip
// its rows are skipped), so a read never mixes a changed file's bytes with the footer the
// plan came from. A deleted file is not a change (what was read came through a
// descriptor opened before); its next open fails and names it. Remote files read from a
// cached copy are checked when the copy is made (FileCache). What a stamp cannot see: a
// rewrite of the same size within the timestamp's granularity (a few ms locally, 1 s on
// S3) of the stamp.
//
// Thread-compatible: concurrent ReadTokens calls need external synchronization; the
// source loader calls it from its one reader thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <arrow/array.h>
#include <arrow/record_batch.h>
#include <arrow/filesystem/filesystem.h>
#include <arrow/io/interfaces.h>

#include "braid/config/config.h"
#include "braid/io/file_cache.h"
#include "braid/status.h"

namespace parquet {
class ReaderProperties;
}
namespace parquet::arrow {
class FileReader;
}

namespace braid {

namespace internal {
class FormatReader;
}

/// Resolves `path` to a filesystem and the sorted list of file paths it names. With
/// `anonymous`, a gs:// filesystem uses no credentials (storage.anonymous).
/// Fails (data error naming `key_path` and the path) when nothing matches.
Status ResolveFiles(const std::string& path, const std::string& key_path,
                    std::shared_ptr<arrow::fs::FileSystem>* fs,
                    std::vector<std::string>* files, bool anonymous = false);

/// Resolves `path` for a source of `*format`; kAuto is detected (io/formats.h) and set:
/// from the name, else, for a directory or a glob, from the names found (Parquet first).
/// A directory lists the files of the format below it; a file or a glob is taken as
/// named. A Megatron dataset is named by its prefix P (P.idx + P.bin): `path` is P, P.idx,
/// P.bin, a directory (every .idx below it) or a glob (its .idx / .bin matches), and
/// `files` holds the sorted prefixes. Fails (data error naming `key_path` and the path)
/// when nothing matches.
Status ResolveFormatFiles(const std::string& path, const std::string& key_path,
                          std::shared_ptr<arrow::fs::FileSystem>* fs,
                          std::vector<std::string>* files, SourceFormat* format,
                          bool anonymous = false);

/// Opens a Parquet file's reader; a missing file, or a read of it that fails, is a
/// storage error (IOError), a file that is not Parquet (bad magic, truncated footer) a
/// data error naming it. No retries.
Result<std::unique_ptr<parquet::arrow::FileReader>> OpenParquet(arrow::fs::FileSystem* fs,
                                                                const std::string& path);
/// The same for an open file; `path` names it in errors.
Result<std::unique_ptr<parquet::arrow::FileReader>> OpenParquet(
    std::shared_ptr<arrow::io::RandomAccessFile> input, const std::string& path);

/// True for list<int32>, list<int64> and their large_list forms: a token column.
bool IsTokenListType(const arrow::DataType& type);

/// The source's path with its storage options (endpoint, region) as URI query
/// parameters, which Arrow's S3 and GCS filesystems read; other paths unchanged.
std::string StorageUri(const SourceConfig& source);

/// A column a transform reads: its name, its config key, and a type check that returns
/// "" when the type is acceptable, else what was expected ("a string column").
struct ColumnSpec {
  std::string name;
  std::string key;
  std::function<std::string(const arrow::DataType&)> check;
  /// The source's length column (sources[].length_column): a missing or mistyped one is
  /// a config error, it is not counted in File::row_group_bytes (it must not move the
  /// windows), and ReadLengths reads it instead of the token column's levels.
  bool length = false;
  /// The transform takes whatever type the file holds (a user transform's column): a
  /// format whose values have no type until parsed (JSON Lines) infers it from the
  /// source's first records and holds it (docs/sources.md, "User transforms").
  bool any_type = false;
};

/// The spec of a token column (list<int32|int64>).
ColumnSpec TokenColumnSpec(const std::string& name, const std::string& key);
/// The spec of a length column (any integer type).
ColumnSpec LengthColumnSpec(const std::string& name, const std::string& key);

/// Row `i` of an integer array as int64 (a uint64 past int64's range: -1); false if
/// null. REQUIRES: an integer array.
bool IntegerAt(const arrow::Array& a, int64_t i, int64_t* out);

/// One row's token count, read without its tokens (SourceFiles::ReadLengths).
struct RowLength {
  int64_t tokens = 0;        ///< the token list's length (0 when null)
  bool null = false;         ///< the row (its token list) is null
  bool null_values = false;  ///< the list holds a null id
};

class SourceFiles {
 public:
  struct File {
    std::string path;
    std::vector<int64_t> row_group_rows;
    std::vector<int64_t> row_group_first_row;  ///< row index of each row group's first row
    int column = -1;                           ///< field index of the first column
    int64_t num_rows = 0;
    /// Why the footer could not be read (on_error: skip only; the file then has no row
    /// groups and no rows); "" for a readable file.
    std::string unreadable;
    /// A file whose bytes went bad part way (cut short, corrupt; JSON Lines, WebDataset,
    /// save_to_disk's Arrow streams; on_error: skip only): why. Its rows are the records,
    /// samples or record batches before the damage; "" for a file read to its end.
    std::string damaged;
    /// What the read columns of each row group decode to, about, from the footer: per
    /// column chunk its uncompressed size or, for fixed-width values, values * width.
    std::vector<int64_t> row_group_bytes;
    /// With a length cache (SourceConfig::length_cache_dir): per row group, a hash of its
    /// read column chunks' footer metadata (offsets, sizes, value counts, statistics), so
    /// a rewritten row group gets new cache entries (io/length_cache.h); else empty.
    std::vector<uint64_t> row_group_digest;
  };

  /// Resolves and opens every file of `source`; `key_path` is its config path
  /// ("sources[2]"). Fails if no file matches, a footer is unreadable (with on_error:
  /// skip: if no footer is readable), a column is missing or of the wrong type, or the
  /// source has no rows.
  static Result<std::unique_ptr<SourceFiles>> Open(const SourceConfig& source,
                                                   const std::string& key_path,
                                                   std::vector<ColumnSpec> columns);
  /// The same for the source's token column (`tokens_column`).
  static Result<std::unique_ptr<SourceFiles>> Open(const SourceConfig& source,
                                                   const std::string& key_path);
  ~SourceFiles();

  const std::vector<File>& files() const { return files_; }
  /// The format of the files (never kAuto): Parquet, or the one the source's path or
  /// `format` named; for another format than Parquet a file's row groups are that
  /// format's units (a Megatron dataset's runs of documents, ...; docs/sources.md).
  SourceFormat format() const { return format_; }
  /// The row group a location names for unit `unit` (DataLocation): -1 where a file is
  /// one unit (JSON Lines, WebDataset: a row is named by its index in the file alone).
  int64_t NamedRowGroup(int64_t unit) const {
    const bool one_unit =
        format_ == SourceFormat::kJsonl || format_ == SourceFormat::kWebDataset;
    return one_unit ? -1 : unit;
  }
  int64_t total_rows() const { return total_rows_; }
  /// Files whose footer could not be read (File::unreadable set).
  int64_t unreadable_files() const { return unreadable_files_; }
  /// Files unreadable or lost to storage failures so far (see the header).
  int64_t lost_files() const { return unreadable_files_ + dead_files_; }
  /// True once `file` is lost to storage failures (its reads fail at once).
  bool is_lost(int file) const { return !lost_[size_t(file)].ok(); }

  /// The columns of one row group, in ColumnSpec order, one chunk each. A storage failure
  /// is retried (see the header); the error is a storage error (IOError) when the storage
  /// failed, a data error when the bytes are bad.
  Result<std::vector<std::shared_ptr<arrow::Array>>> ReadColumns(int file, int row_group);

  /// The columns of one row group as consecutive chunks of its rows, each in ColumnSpec
  /// order: ReadColumns' one chunk for Parquet and formats read whole, the reader's own
  /// pieces for a format read as a stream (JSON Lines: Arrow's blocks, not concatenated).
  /// Retried and failing as ReadColumns.
  Result<std::vector<std::vector<std::shared_ptr<arrow::Array>>>> ReadChunks(int file,
                                                                             int row_group);

  /// Block `block` of one row group cut into blocks of `block_rows` rows (the last one
  /// shorter): its rows in order as consecutive chunks of about kBlockChunkBytes, each
  /// the columns in ColumnSpec order (as ReadColumns). The chunks come from a streaming
  /// reader that holds about a page and a chunk per column, not the row group, and stays
  /// open: reading a row group's blocks in order decodes it once; a block behind the
  /// reader reopens the row group.
  Result<std::vector<std::vector<std::shared_ptr<arrow::Array>>>> ReadBlock(
      int file, int row_group, int64_t block_rows, int64_t block);

  /// The bytes of one chunk of ReadBlock, about (the footer's estimate).
  static constexpr int64_t kBlockChunkBytes = int64_t{256} << 10;

  /// The first column of one row group (the token column of a token source).
  Result<std::shared_ptr<arrow::Array>> ReadTokens(int file, int row_group);

  /// Each row's token count in one row group, without reading the tokens: the length
  /// column's values when the source has one (a negative value is a data error naming the
  /// row and the column), else the list lengths of the first column (a token list),
  /// counted from its repetition and definition levels alone (no id is decoded or
  /// materialized; docs/decisions.md 30). Holds about a page and a read buffer while
  /// reading; the last row group's counts are kept (the blocks of one row group read them
  /// once). Storage failures are retried and lose the file as for ReadColumns.
  Result<std::shared_ptr<const std::vector<RowLength>>> ReadLengths(int file,
                                                                    int row_group);

  /// The counts of rows [first, first + rows) of one row group (a block of it): for a
  /// JSON Lines file or a WebDataset shard (one unit of the whole file, whose counts are
  /// its lists' lengths) read from those rows alone, as ReadBlock reads them (so a block
  /// behind the reader enters a shard at its Energon offset); else sliced from
  /// ReadLengths (the whole row group's counts, kept for its next block). Retried and
  /// failing as ReadLengths.
  Result<std::shared_ptr<const std::vector<RowLength>>> ReadBlockLengths(int file,
                                                                         int row_group,
                                                                         int64_t first,
                                                                         int64_t rows);

  /// Why row `row` of file `file` was read as null by its format's reader itself (a
  /// JSON Lines line that does not parse, under on_error: skip), for the loader's skip
  /// line; empty when it was not, or for a Parquet file. Thread-safe, unlike the reads.
  std::string WhyNull(int file, int64_t row) const;

 private:
  SourceFiles() = default;

  // Opens file `index` (`remote` in fs_) from its cached copy when the source is cached
  // and the copy is there (made first when `download`), else from fs_, with `props`
  // (null: Parquet's defaults). The reader pins the copy while it lives. `io_failed`
  // (may be null) is set when a read of the underlying file fails.
  Result<std::unique_ptr<parquet::arrow::FileReader>> OpenFile(
      const std::string& remote, size_t index, bool download,
      std::shared_ptr<std::atomic<bool>> io_failed = nullptr,
      const parquet::ReaderProperties* props = nullptr);
  // One try of ReadBlock on a Parquet file.
  Result<std::vector<std::vector<std::shared_ptr<arrow::Array>>>> ReadParquetBlock(
      int file, int row_group, int64_t block_rows, int64_t block);
  // One try of ReadColumns.
  Result<std::vector<std::shared_ptr<arrow::Array>>> ReadColumnsOnce(int file,
                                                                     int row_group);
  // One try of ReadLengths, and its two ways.
  Result<std::shared_ptr<const std::vector<RowLength>>> ReadLengthsOnce(int file,
                                                                        int row_group);
  Result<std::vector<RowLength>> LengthsFromColumn(int file, int row_group);
  Result<std::vector<RowLength>> LengthsFromLevels(int file, int row_group);
  // Runs `read` (one try) with ReadColumns' retries; a storage failure that outlasts
  // them loses the file.
  template <typename T>
  Result<T> Retried(int file, int row_group, const std::function<Result<T>()>& read);

  // The files behind file `path` (a Megatron dataset: its .idx and .bin; else itself).
  std::vector<std::string> Underlying(const std::string& path) const;
  // Stamps file `index` (stamps_): each underlying file's type, size and modification
  // time (a storage error when a stat fails; the caller retries). Calls for different
  // indexes may run at once when stamps_ already holds `index`.
  Status Stamp(size_t index, const std::string& path);
  // After a read of `file`: a data error naming it (and it is lost) when an underlying
  // file changed since its stamp; a storage error when that cannot be told (retried with
  // the read).
  Status CheckUnchanged(int file);
  // Drops every open reader and what they kept.
  void CloseReaders();

  // Opens the files of a format other than Parquet (format_reader_).
  Status OpenFormat(const SourceConfig& source, const std::string& key_path,
                    const std::vector<std::string>& paths);
  // runtime.cache for a remote source of a format that reads its files whole when it
  // opens them (JSON Lines counts, save_to_disk walks): null without one, or locally.
  std::shared_ptr<FileCache> WholeFileCache(const SourceConfig& source) const;

  SourceFormat format_ = SourceFormat::kParquet;
  // The reader of a format other than Parquet; null for Parquet.
  std::unique_ptr<internal::FormatReader> format_reader_;
  std::shared_ptr<arrow::fs::FileSystem> fs_;
  std::shared_ptr<FileCache> cache_;         // set when remote files are cached
  // Per file: the stamp of each underlying file (see the header); for a cached Parquet
  // file the first is also its copy's key. from_copy_: read from a cached copy, which
  // FileCache checked when it was made.
  std::vector<std::vector<arrow::fs::FileInfo>> stamps_;
  std::vector<bool> from_copy_;
  std::vector<ColumnSpec> columns_;
  std::vector<File> files_;
  std::vector<std::vector<int>> column_index_;  // per file, per ColumnSpec
  int64_t total_rows_ = 0;
  int64_t unreadable_files_ = 0;
  std::vector<Status> lost_;  // per file: the storage error that lost it, else OK
  int64_t dead_files_ = 0;    // files with an error in lost_
  // The reader of the file read last; row groups of one file are often read in a row.
  int open_file_ = -1;
  std::unique_ptr<parquet::arrow::FileReader> open_reader_;
  std::shared_ptr<std::atomic<bool>> open_io_failed_;  // open_reader_'s reads failed
  // ReadBlock's streaming reader: row group (block_file_, block_row_group_), the rows
  // read so far ending at block_next_; block_rest_ (rows from block_rest_first_ on) is
  // the part of the last chunk that belongs to the next block.
  std::vector<std::vector<int>> leaf_index_;  // per file: the leaf columns read
  int block_file_ = -1;
  int block_row_group_ = -1;
  int64_t block_next_ = 0;
  std::vector<std::shared_ptr<arrow::Array>> block_rest_;
  int64_t block_rest_first_ = 0;
  std::unique_ptr<parquet::arrow::FileReader> block_file_reader_;
  std::unique_ptr<arrow::RecordBatchReader> block_reader_;
  // ReadLengths: the spec index of the length column (-1: none, levels are counted), a
  // reader with a small buffered stream on file lengths_file_, and the counts of the row
  // group read last.
  int length_spec_ = -1;
  int lengths_file_ = -1;
  std::unique_ptr<parquet::arrow::FileReader> lengths_reader_;
  std::shared_ptr<std::atomic<bool>> lengths_io_failed_;
  int lengths_cached_file_ = -1;
  int lengths_cached_row_group_ = -1;
  std::shared_ptr<const std::vector<RowLength>> lengths_cached_;
};

}  // namespace braid
