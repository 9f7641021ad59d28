// The reader of one non-Parquet format behind SourceFiles (source_files.h). SourceFiles
// owns the source's file list, retries, lost files and the last counts read; a
// FormatReader owns the format's open files and turns one unit of a file (what a row
// group is to Parquet: a run of documents, records or rows that the order permutes) into
// the columns a transform reads, in ColumnSpec order, or into token counts.
//
// Errors: a storage failure (a read of the underlying file failed) is an IOError, which
// SourceFiles retries; bad bytes are a data error naming the file, the record and the key.
//
// Thread-compatible: SourceFiles calls one reader from one thread at a time.
#pragma once

#include <arrow/filesystem/filesystem.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "braid/config/config.h"
#include "braid/io/source_files.h"
#include "braid/status.h"

namespace braid::internal {

class FormatReader {
 public:
  using Columns = std::vector<std::shared_ptr<arrow::Array>>;
  virtual ~FormatReader() = default;

  /// The columns of unit `unit` of file `file`, one array each.
  virtual Result<Columns> ReadColumns(int file, int unit) = 0;

  /// The columns of unit `unit` as consecutive chunks of its rows (SourceFiles::
  /// ReadChunks). The default is ReadColumns' one chunk.
  virtual Result<std::vector<Columns>> ReadChunks(int file, int unit);

  /// Rows [first, first + rows) of one unit, as consecutive chunks of columns (a unit
  /// larger than the source's shuffle_window_bytes is read in such blocks). The default
  /// reads the unit and slices it.
  virtual Result<std::vector<Columns>> ReadRows(int file, int unit, int64_t first,
                                                int64_t rows);

  /// Each row's token count in one unit without its tokens, for token sources; formats
  /// without counts return NotImplemented (their sources are not token sources).
  virtual Result<std::vector<RowLength>> ReadLengths(int file, int unit);

  /// The counts of rows [first, first + rows) of one unit alone, for formats whose
  /// ReadLengths reads the whole unit's rows (a JSON Lines file, a WebDataset shard:
  /// their lists are read to be counted), so a block of a large unit is counted from its
  /// own rows (ReadRows: the stream that stays open, an Energon offset) and not from all
  /// of the unit's. Null when the whole unit's counts are the cheaper way (the default:
  /// Megatron's index, an IPC batch's offsets).
  virtual Result<std::optional<std::vector<RowLength>>> ReadRowLengths(int file, int unit,
                                                                       int64_t first,
                                                                       int64_t rows);

  /// Why the reader gave row `row` of file `file` as null itself (a JSON Lines line that
  /// does not parse, under on_error: skip), for the loader's skip line; empty when it
  /// did not, or no longer keeps why. Thread-safe (the loader asks from its workers
  /// while its reader thread reads).
  virtual std::string WhyNull(int /*file*/, int64_t /*row*/) const { return {}; }
};

/// What opening a format's files gives SourceFiles.
struct FormatOpen {
  std::unique_ptr<FormatReader> reader;
  std::vector<SourceFiles::File> files;
  int64_t unreadable = 0;        ///< files kept with File::unreadable set (on_error: skip)
  std::string first_unreadable;  ///< the error of the first of them

  /// Keeps `file` as unreadable (on_error: skip) with `error`'s message, less a leading
  /// "`path`: " when `path` is given (File::unreadable is shown after the path).
  void KeepUnreadable(SourceFiles::File file, const Status& error, const std::string& path);

  /// Counts one file of AddWholeFiles (`file`: its index in `paths`) into its rows and
  /// decoded bytes. Called for several files at once, from other threads. A file whose
  /// bytes go bad after some rows (a truncated stream) may return OK with those rows,
  /// the decoded bytes that hold them, and the error in `damage`.
  using WholeFileCount =
      std::function<Status(size_t file, int64_t* rows, int64_t* bytes, Status* damage)>;

  /// Adds `paths`, files that are one unit each (JSON Lines, WebDataset), in order: each
  /// one's rows and decoded bytes counted by `count` (retried on storage errors), or
  /// taken for an unchanged file (its stamp in `stamps`: size and modification time)
  /// from the counts kept in this process or, with runtime.length_cache, from there
  /// (`tag`: the format and what was counted; a count is kept in both). The files are
  /// counted concurrently on Arrow's I/O thread pool. Returns each file's rows, -1 for
  /// one kept as unreadable (on_error: skip); fails (RefuseUnreadable) on the first
  /// file, in path order, that cannot be counted otherwise. A damaged file (`count`'s
  /// `damage`) is an error too under on_error: fail; under skip it keeps the rows before
  /// the damage (File::damaged says why; none: unreadable). A damaged file's counts are
  /// not kept, so that every open finds the damage again.
  Result<std::vector<int64_t>> AddWholeFiles(
      arrow::fs::FileSystem* fs, const std::vector<std::string>& paths,
      const std::vector<arrow::fs::FileInfo>& stamps, const SourceConfig& source,
      const std::string& tag, const WholeFileCount& count);
};

/// `error`'s message less a leading "`path`: " (File::unreadable and File::damaged are
/// shown after the path).
std::string MessageAfterPath(const Status& error, const std::string& path);

/// `error` of an unreadable file under on_error: raise, with the hint that says how to
/// skip such files (and the tries it took, when more than one).
Status RefuseUnreadable(const Status& error, int tries);

/// Each row's token count of a token column (list or large_list of integers): its
/// lists' lengths, a null row null, a null id noted.
std::vector<RowLength> ListLengths(const arrow::Array& list);

/// FormatReader::ReadRowLengths of a format whose token column is its first column:
/// ListLengths of `reader`'s ReadRows(file, unit, first, rows).
Result<std::optional<std::vector<RowLength>>> ListLengthsOfRows(FormatReader* reader,
                                                                int file, int unit,
                                                                int64_t first,
                                                                int64_t rows);

/// The Arrow type a column is read as from JSON (JSON Lines records, WebDataset `.json`
/// members): the first of string, list<int32>, chat messages
/// (list<struct<role, content>>) and int64 that its spec accepts; null if none.
std::shared_ptr<arrow::DataType> JsonColumnType(const ColumnSpec& spec);

/// The type each of `fields` (name, config key) holds in the JSON objects `records` (the
/// first records of `file`, named in errors), as a user transform's columns are typed on
/// JSON Lines and WebDataset JSON members (docs/sources.md, "User transforms"): each
/// record typed alone by Arrow's inference (arrow::json::ParseOne), the types unified as
/// Arrow unifies schemas, permissively; a record that does not parse does not count.
/// Types that do not unify are a data error naming `file` and the field; a field with no
/// value there (absent, or only nulls and empty lists) a config error naming its key,
/// ending with `rule` (where the source takes its types from). jsonl_files.cc.
Result<std::vector<std::shared_ptr<arrow::DataType>>> TypeOfFields(
    const std::vector<std::string>& records, const std::string& file,
    const std::vector<std::pair<std::string, std::string>>& fields,
    const std::string& rule);

/// Counts of a file kept in runtime.length_cache (`dir`) by the formats that count their
/// records when a source opens (JSON Lines, WebDataset): one small file per counted file,
/// named by the hash of its key, holding the key itself (compared on read) and the
/// counts. KeptCountKey is `tag` (the format's and what was counted), the path, the
/// size and the modification time, so a rewritten file is a miss. A damaged or foreign
/// entry is a miss; writes go to a temporary name first and never fail the caller.
std::string KeptCountKey(const std::string& tag, const std::string& path,
                         const arrow::fs::FileInfo& info);
bool ReadKeptCount(const std::string& dir, const std::string& key, int64_t* records,
                   int64_t* bytes);
void WriteKeptCount(const std::string& dir, const std::string& key, int64_t records,
                    int64_t bytes);
/// The same kept in this process, for every source (thread-safe): a file opened again
/// (by another loader of its source, the planner's stream, a server) is not counted
/// again while it is unchanged.
bool CountKeptInProcess(const std::string& key, int64_t* records, int64_t* bytes);
void KeepCountInProcess(const std::string& key, int64_t records, int64_t bytes);
/// Forgets the counts kept in this process (a test that shows what runtime.length_cache
/// alone keeps). Thread-safe.
void ForgetCountsKeptInProcess();

/// Opens the Megatron indexed datasets `prefixes` of `fs` (io/megatron_index.h): each is
/// one file of the source; its units are runs of documents. Reads each index's header
/// and the .bin's size, nothing more. With on_error: skip a dataset whose header is bad
/// is kept as unreadable; else that is an error naming the .idx.
Result<FormatOpen> OpenMegatronFiles(std::shared_ptr<arrow::fs::FileSystem> fs,
                                     const std::vector<std::string>& prefixes,
                                     const SourceConfig& source,
                                     const std::string& key_path,
                                     const std::vector<ColumnSpec>& columns);

/// Opens the JSON Lines files `paths` of `fs` (.jsonl / .json, plain, .gz or .zst; one
/// unit per file, io/jsonl_files.cc; `stamps`: each path's stamp, SourceFiles'): reads
/// each once to count its records, through `cache` (runtime.cache, or null) when given,
/// as every later read of a file is. A user transform's column (ColumnSpec::any_type)
/// and an image column (one that takes binary: the field holds paths or data: URIs,
/// loaded from `source.image_folder` or the file's folder) are typed by the first file's
/// first records; another column whose spec accepts none of string, list<int32>, chat
/// messages or int64 is a config error naming its key; with on_error: skip a file that
/// does not decompress is kept as unreadable, else that is an error naming it.
Result<FormatOpen> OpenJsonlFiles(std::shared_ptr<arrow::fs::FileSystem> fs,
                                  std::shared_ptr<FileCache> cache,
                                  const std::vector<std::string>& paths,
                                  const std::vector<arrow::fs::FileInfo>& stamps,
                                  const SourceConfig& source, const std::string& key_path,
                                  const std::vector<ColumnSpec>& columns);

/// The top-level fields of the first records of the JSON Lines file `path` (`braid
/// inspect`), first seen first, each with the type a user transform's column of that
/// name would get (OpenJsonlFiles), "mixed types" where the records' types do not unify.
Result<std::vector<std::pair<std::string, std::string>>> JsonlFieldTypes(
    arrow::fs::FileSystem* fs, const std::string& path);

/// Opens the Arrow IPC stream files `paths` of `fs` (Hugging Face save_to_disk's
/// .arrow; io/hf_arrow_files.cc): one unit per record batch; walks each file's messages
/// once (a remote file through `cache`, runtime.cache or null, when given; `stamps`:
/// each path's, SourceFiles'). A missing or mistyped column is a data error naming the
/// file whatever on_error says; with on_error: skip a file that is not an IPC stream is
/// kept as unreadable.
Result<FormatOpen> OpenHfArrowFiles(std::shared_ptr<arrow::fs::FileSystem> fs,
                                    std::shared_ptr<FileCache> cache,
                                    const std::vector<std::string>& paths,
                                    const std::vector<arrow::fs::FileInfo>& stamps,
                                    const SourceConfig& source,
                                    const std::string& key_path,
                                    const std::vector<ColumnSpec>& columns);

/// Opens the WebDataset tar shards `paths` of `fs` (`.tar`, `.tar.gz`, `.tgz`; one unit
/// per shard, io/webdataset_files.cc; `stamps` as for OpenJsonlFiles) with libarchive:
/// counts each shard's samples from
/// the Megatron-Energon index of its folder (io/webdataset_index_internal.h) when that
/// agrees with the shard, else by reading its member headers once (members grouped by the
/// name before the first dot of their basename). A column names a member extension
/// (`txt`), alternatives (`jpg;png;webp`:
/// the first one a sample has) or a field of a JSON member (`json:FIELD`). A column
/// whose spec accepts none of the types such members give is a config error naming its
/// key; with on_error: skip a shard that is not a readable tar is kept as unreadable,
/// else that is an error naming it.
Result<FormatOpen> OpenWebDatasetFiles(std::shared_ptr<arrow::fs::FileSystem> fs,
                                       const std::vector<std::string>& paths,
                                       const std::vector<arrow::fs::FileInfo>& stamps,
                                       const SourceConfig& source,
                                       const std::string& key_path,
                                       const std::vector<ColumnSpec>& columns);

/// The member extensions of the first samples (at most `samples`) of the WebDataset
/// shard `path`, in the order met, each once (braid inspect).
Result<std::vector<std::string>> WebDatasetExtensions(arrow::fs::FileSystem* fs,
                                                      const std::string& path,
                                                      int64_t samples);

}  // namespace braid::internal
