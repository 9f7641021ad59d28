// Opening Parquet files (source_files.h: OpenParquet; source_files_internal.h): through a
// WatchedFile, which notes whether a read of the underlying file failed, so that a
// failure of the Parquet reader above it can be blamed on the storage (retry, then a
// storage error) or on the bytes (a data error, never retried).
//
// Thread-safe: each call opens its own reader.
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <arrow/io/api.h>
#include <arrow/util/future.h>
#include <parquet/arrow/reader.h>
#include <parquet/properties.h>

#include "braid/io/read_memory.h"
#include "braid/io/source_files.h"
#include "braid/io/source_files_internal.h"

namespace braid {
namespace internal {
namespace {

// A file that notes in `failed` whether a read of the underlying file failed.
class WatchedFile : public arrow::io::RandomAccessFile {
 public:
  WatchedFile(std::shared_ptr<arrow::io::RandomAccessFile> inner,
              std::shared_ptr<std::atomic<bool>> failed)
      : inner_(std::move(inner)), failed_(std::move(failed)) {}

  arrow::Status Close() override { return inner_->Close(); }
  bool closed() const override { return inner_->closed(); }
  arrow::Result<int64_t> Tell() const override { return inner_->Tell(); }
  arrow::Status Seek(int64_t position) override { return Note(inner_->Seek(position)); }
  arrow::Result<int64_t> GetSize() override { return Note(inner_->GetSize()); }
  bool supports_zero_copy() const override { return inner_->supports_zero_copy(); }
  const arrow::io::IOContext& io_context() const override { return inner_->io_context(); }
  arrow::Result<int64_t> Read(int64_t nbytes, void* out) override {
    return Note(inner_->Read(nbytes, out));
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> Read(int64_t nbytes) override {
    return Note(inner_->Read(nbytes));
  }
  arrow::Result<int64_t> ReadAt(int64_t position, int64_t nbytes, bool allow_short_read,
                                void* out) override {
    return Note(inner_->ReadAt(position, nbytes, allow_short_read, out));
  }
  arrow::Result<int64_t> ReadAt(int64_t position, int64_t nbytes, void* out) override {
    return Note(inner_->ReadAt(position, nbytes, out));
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(int64_t position, int64_t nbytes,
                                                       bool allow_short_read) override {
    return Note(inner_->ReadAt(position, nbytes, allow_short_read));
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(int64_t position,
                                                       int64_t nbytes) override {
    return Note(inner_->ReadAt(position, nbytes));
  }
  arrow::Future<std::shared_ptr<arrow::Buffer>> ReadAsync(
      const arrow::io::IOContext& ctx, int64_t position, int64_t nbytes,
      bool allow_short_read) override {
    return Watch(inner_->ReadAsync(ctx, position, nbytes, allow_short_read));
  }
  arrow::Future<std::shared_ptr<arrow::Buffer>> ReadAsync(const arrow::io::IOContext& ctx,
                                                          int64_t position,
                                                          int64_t nbytes) override {
    return Watch(inner_->ReadAsync(ctx, position, nbytes));
  }
  arrow::Status WillNeed(const std::vector<arrow::io::ReadRange>& ranges) override {
    return inner_->WillNeed(ranges);
  }

 private:
  arrow::Status Note(arrow::Status st) {
    if (!st.ok()) failed_->store(true);
    return st;
  }
  template <typename T>
  arrow::Result<T> Note(arrow::Result<T> r) {
    if (!r.ok()) failed_->store(true);
    return r;
  }
  arrow::Future<std::shared_ptr<arrow::Buffer>> Watch(
      arrow::Future<std::shared_ptr<arrow::Buffer>> f) {
    return f.Then(
        [](const std::shared_ptr<arrow::Buffer>& b) { return b; },
        [failed = failed_](const arrow::Status& st)
            -> arrow::Result<std::shared_ptr<arrow::Buffer>> {
          failed->store(true);
          return st;
        });
  }

  std::shared_ptr<arrow::io::RandomAccessFile> inner_;
  std::shared_ptr<std::atomic<bool>> failed_;
};

}  // namespace

std::string OneLine(std::string message) {
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
    message.pop_back();
  }
  for (size_t at = message.find('\n'); at != std::string::npos;
       at = message.find('\n', at)) {
    message.replace(at, 1, " ");
  }
  return message;
}

Status ErrorAt(const Status& st, const std::string& path, const std::string& where) {
  std::string what = st.message();
  const std::string prefix = path + ": ";
  if (what.compare(0, prefix.size(), prefix) == 0) what.erase(0, prefix.size());
  return st.IsIOError() ? StorageError(where, what) : DataError(where, what);
}

Result<std::unique_ptr<parquet::arrow::FileReader>> OpenWatched(
    arrow::fs::FileSystem* fs, const std::string& path,
    std::shared_ptr<std::atomic<bool>> io_failed,
    const parquet::ReaderProperties* props) {
  auto input = fs->OpenInputFile(path);
  if (!input.ok()) return StorageError(path, OneLine(input.status().message()));
  return OpenWatchedInput(std::move(*input), path, std::move(io_failed), props);
}

Result<std::unique_ptr<parquet::arrow::FileReader>> OpenWatchedInput(
    std::shared_ptr<arrow::io::RandomAccessFile> input, const std::string& path,
    std::shared_ptr<std::atomic<bool>> io_failed,
    const parquet::ReaderProperties* props) {
  auto file = std::make_shared<WatchedFile>(std::move(input), io_failed);
  std::string what;
  try {
    // Pages and arrays both in Braid's read pool (io/read_memory.h), unless the
    // caller gives its own reader properties.
    const parquet::ReaderProperties defaults(ReadMemoryPool());
    parquet::arrow::FileReaderBuilder builder;
    Status st = builder.Open(file, props != nullptr ? *props : defaults);
    if (st.ok()) {
      builder.memory_pool(ReadMemoryPool());
      auto reader = builder.Build();
      if (reader.ok()) return std::move(*reader);
      st = reader.status();
    }
    what = st.message();
  } catch (const std::exception& e) {
    what = e.what();
  }
  if (io_failed->load()) {
    return StorageError(path, "cannot read the footer: " + OneLine(what));
  }
  return DataError(path, "not a readable Parquet file: " + OneLine(what));
}

}  // namespace internal

Result<std::unique_ptr<parquet::arrow::FileReader>> OpenParquet(arrow::fs::FileSystem* fs,
                                                                const std::string& path) {
  return internal::OpenWatched(fs, path, std::make_shared<std::atomic<bool>>(false));
}

Result<std::unique_ptr<parquet::arrow::FileReader>> OpenParquet(
    std::shared_ptr<arrow::io::RandomAccessFile> input, const std::string& path) {
  return internal::OpenWatchedInput(std::move(input), path,
                                    std::make_shared<std::atomic<bool>>(false));
}

}  // namespace braid
