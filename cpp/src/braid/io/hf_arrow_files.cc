// A source's Hugging Face `datasets` save_to_disk folders behind SourceFiles
// (format_reader_internal.h: OpenHfArrowFiles): Arrow IPC *stream* files
// (data-0000k-of-0000n.arrow, beside state.json and dataset_info.json), read with Arrow's
// IPC reader. Each .arrow file is a file of the source and each record batch in it a
// unit (what a row group is to Parquet; `datasets` writes batches of writer_batch_size,
// 1000 rows by default). A stream has no footer, so opening walks each file's messages
// once for the schema, every batch's rows and the byte offset of its message; a unit is
// then read alone at its offset (arrow::ipc::ReadRecordBatch on a stream over that range
// of the file). Local files are memory-mapped, as `datasets` does, and held as one buffer
// of the whole mapping, so walking them reads only the messages' metadata and a batch's
// columns are views of the mapping. A remote file with runtime.cache is copied into the
// cache whole (the walk reads it whole anyway) and its copy mapped, pinned while the
// source is open; without a cache it is read remotely, walked and then read again by
// batch.
//
// Errors: a failed read of the underlying file is a storage error; bytes that are not an
// IPC stream, a column missing or of another type than the transform reads are data
// errors naming the file (and, for a read, the batch). Under on_error: skip a file whose
// stream goes bad after whole batches (cut short) keeps those batches (File::damaged).
//
// Thread-compatible (format_reader_internal.h).
#include <algorithm>

#include <arrow/api.h>
#include <arrow/io/api.h>
#include <arrow/ipc/api.h>

#include "braid/io/file_cache.h"
#include "braid/io/format_reader_internal.h"
#include "braid/io/read_memory.h"
#include "braid/io/retry_internal.h"
#include "braid/io/source_files_internal.h"
#include "braid/util/hash_internal.h"

namespace braid::internal {
namespace {

struct ArrowFile {
  std::string path;
  arrow::fs::FileInfo stamp;  // SourceFiles' (the cache's key)
  std::shared_ptr<arrow::io::RandomAccessFile> input;
  std::shared_ptr<arrow::io::RandomAccessFile> pin;  // its copy in runtime.cache, held
  bool local = false;  // read from a local file (a failed read is the bytes', not storage)
  std::shared_ptr<arrow::Schema> schema;
  std::vector<int> columns;       // per ColumnSpec, its field index
  std::vector<int64_t> offsets;   // per batch, its message's offset; then the stream's end
};

// The whole mapping of local file `local_path` as one buffer: walking and reading
// batches then slice it, with no system call per read (a mapped file's reads each advise
// the kernel). Errors name `path`.
Result<std::shared_ptr<arrow::io::RandomAccessFile>> MapWhole(const std::string& local_path,
                                                              const std::string& path) {
  auto mapped = arrow::io::MemoryMappedFile::Open(local_path, arrow::io::FileMode::READ);
  if (!mapped.ok()) return StorageError(path, mapped.status().message());
  auto size = (*mapped)->GetSize();
  if (!size.ok()) return StorageError(path, size.status().message());
  auto whole = (*mapped)->ReadAt(0, *size);
  if (!whole.ok()) return StorageError(path, whole.status().message());
  return std::make_shared<arrow::io::BufferReader>(std::move(*whole));
}

// Opens f's input: a local file mapped; a remote one's copy in `cache` (runtime.cache:
// downloaded whole the first time, which the walk reads anyway) mapped and pinned; else
// the remote file.
Status OpenInput(arrow::fs::FileSystem* fs, FileCache* cache, ArrowFile* f) {
  f->pin.reset();
  f->local = fs->type_name() == "local";
  if (f->local) {
    ARROW_ASSIGN_OR_RAISE(f->input, MapWhole(f->path, f->path));
    return Status::OK();
  }
  if (cache != nullptr) {
    auto copy = cache->Open(fs, f->stamp, /*download=*/true);
    if (!copy.ok()) return StorageError(f->path, copy.status().message());
    if (*copy) {
      f->pin = std::move(*copy);
      f->local = true;
      ARROW_ASSIGN_OR_RAISE(f->input, MapWhole(cache->CopyPath(f->stamp), f->path));
      return Status::OK();
    }
  }
  auto input = fs->OpenInputFile(f->path);
  if (!input.ok()) return StorageError(f->path, input.status().message());
  f->input = std::move(*input);
  return Status::OK();
}

// Walks one file's stream: the schema, each batch's rows and offset. A stream whose
// bytes go bad after whole batches (a file cut short) gives those batches, its end at
// the last of them, and the error in `damage`.
Status Walk(arrow::fs::FileSystem* fs, FileCache* cache,
            const std::vector<ColumnSpec>& specs, ArrowFile* f, std::vector<int64_t>* rows,
            Status* damage) {
  *damage = Status::OK();
  rows->clear();
  f->offsets.clear();
  ARROW_RETURN_NOT_OK(OpenInput(fs, cache, f));
  const bool local = f->local;
  auto what = [&](const Status& st) {
    // A failed read of a remote file is the storage's (a mapped local file's bytes are
    // there); anything else is the bytes'.
    return st.IsIOError() && !local
               ? StorageError(f->path, OneLine(st.message()))
               : DataError(f->path, "not an Arrow IPC stream (save_to_disk's .arrow): " +
                                        OneLine(st.message()));
  };
  ARROW_RETURN_NOT_OK(f->input->Seek(0));
  auto options = arrow::ipc::IpcReadOptions::Defaults();
  options.memory_pool = ReadMemoryPool();
  auto reader = arrow::ipc::RecordBatchStreamReader::Open(f->input, options);
  if (!reader.ok()) return what(reader.status());
  f->schema = (*reader)->schema();
  for (const auto& field : f->schema->fields()) {
    if (field->type()->id() == arrow::Type::DICTIONARY) {
      return DataError(f->path, "column '" + field->name() +
                                    "' is dictionary-encoded, which Braid does not read");
    }
  }
  f->columns.clear();
  for (const auto& c : specs) {
    const int index = f->schema->GetFieldIndex(c.name);
    if (index < 0) {
      std::string names;
      for (const auto& field : f->schema->fields()) {
        names += (names.empty() ? "" : ", ") + field->name();
      }
      return DataError(f->path, "no column '" + c.name + "' (" + c.key + "); columns: " +
                                    names);
    }
    const auto& type = *f->schema->field(index)->type();
    const std::string expected = c.check(type);
    if (!expected.empty()) {
      return DataError(f->path, "column '" + c.name + "' (" + c.key + ") has type " +
                                    type.ToString() + ", expected " + expected);
    }
    f->columns.push_back(index);
  }
  while (true) {
    ARROW_ASSIGN_OR_RAISE(const int64_t at, f->input->Tell());
    std::shared_ptr<arrow::RecordBatch> batch;
    Status st = (*reader)->ReadNext(&batch);
    if (!st.ok() && !rows->empty() && (local || !st.IsIOError())) {
      const Status bad = what(st);
      *damage = bad.WithMessage(bad.message(), " (after ", rows->size(), " record batches)");
      f->offsets.push_back(at);
      break;
    }
    if (!st.ok()) return what(st);
    if (batch == nullptr) {
      f->offsets.push_back(at);
      break;
    }
    f->offsets.push_back(at);
    rows->push_back(batch->num_rows());
  }
  return Status::OK();
}

class HfArrowReader : public FormatReader {
 public:
  HfArrowReader(std::vector<ArrowFile> files, std::vector<ColumnSpec> columns)
      : files_(std::move(files)), columns_(std::move(columns)) {}

  Result<Columns> ReadColumns(int file, int unit) override {
    const ArrowFile& f = files_[size_t(file)];
    const std::string where = DataLocation(f.path, unit, -1);
    const int64_t at = f.offsets[size_t(unit)];
    auto stream = arrow::io::RandomAccessFile::GetStream(
        f.input, at, f.offsets[size_t(unit) + 1] - at);
    if (!stream.ok()) return StorageError(where, stream.status().message());
    auto options = arrow::ipc::IpcReadOptions::Defaults();
    options.memory_pool = ReadMemoryPool();
    options.included_fields = f.columns;
    auto batch = arrow::ipc::ReadRecordBatch(f.schema, nullptr, options, stream->get());
    if (!batch.ok()) {
      return DataError(where, "cannot read the record batch: " +
                                  OneLine(batch.status().message()));
    }
    Columns out;
    for (const auto& c : columns_) {
      auto column = (*batch)->GetColumnByName(c.name);
      if (column == nullptr) return DataError(where, "no column '" + c.name + "'");
      out.push_back(std::move(column));
    }
    return out;
  }

  // A token source's counts: the lists' lengths (a batch read, no copy when mapped).
  Result<std::vector<RowLength>> ReadLengths(int file, int unit) override {
    ARROW_ASSIGN_OR_RAISE(auto cols, ReadColumns(file, unit));
    return ListLengths(*cols.front());
  }

 private:
  std::vector<ArrowFile> files_;
  std::vector<ColumnSpec> columns_;
};

}  // namespace

Result<FormatOpen> OpenHfArrowFiles(std::shared_ptr<arrow::fs::FileSystem> fs,
                                    std::shared_ptr<FileCache> cache,
                                    const std::vector<std::string>& paths,
                                    const std::vector<arrow::fs::FileInfo>& stamps,
                                    const SourceConfig& source,
                                    const std::string& /*key_path*/,
                                    const std::vector<ColumnSpec>& columns) {
  FormatOpen out;
  std::vector<ArrowFile> files;
  const bool skip = source.on_error == OnError::kSkip;
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string& path = paths[i];
    ArrowFile f;
    f.path = path;
    f.stamp = stamps[i];
    SourceFiles::File file;
    file.path = path;
    std::vector<int64_t> rows;
    int tries = 0;
    Status damage;
    Status st = RetryStorage(
        [&] { return Walk(fs.get(), cache.get(), columns, &f, &rows, &damage); },
        kStorageRetryDelaysMs, &tries);
    if (st.ok() && !damage.ok()) {
      // Bad bytes after whole batches: an error under on_error: fail; under skip the
      // batches before them (File::damaged).
      if (!skip) return RefuseUnreadable(damage, tries);
      file.damaged = MessageAfterPath(damage, path);
    } else if (st.ok()) {
      // A missing or mistyped column is the files' promise broken: an error whatever
      // on_error says (as for Parquet). Only unreadable bytes are skipped.
    } else if (st.message().find("no column") != std::string::npos ||
               st.message().find(" has type ") != std::string::npos) {
      // (No hint to skip: skipping does not mend it.)
      if (tries > 1) st = st.WithMessage(st.message(), " (", tries, " tries)");
      return st;
    } else if (!skip) {
      return RefuseUnreadable(st, tries);
    } else {
      out.KeepUnreadable(std::move(file), st, path);
      files.push_back(std::move(f));
      continue;
    }
    int64_t first = 0;
    for (size_t b = 0; b < rows.size(); ++b) {
      file.row_group_rows.push_back(rows[b]);
      file.row_group_first_row.push_back(first);
      // What the unit decodes to, about: its message's bytes.
      file.row_group_bytes.push_back(f.offsets[b + 1] - f.offsets[b]);
      if (!source.length_cache_dir.empty()) {
        file.row_group_digest.push_back(
            Fnv1a(path + '|' + std::to_string(f.offsets[b]) + '|' +
                  std::to_string(f.offsets[b + 1]) + '|' + std::to_string(rows[b])));
      }
      first += rows[b];
    }
    file.column = f.columns.empty() ? -1 : f.columns.front();
    file.num_rows = first;
    out.files.push_back(std::move(file));
    files.push_back(std::move(f));
  }
  out.reader = std::make_unique<HfArrowReader>(std::move(files), columns);
  return out;
}

}  // namespace braid::internal
