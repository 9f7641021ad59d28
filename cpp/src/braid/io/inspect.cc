#include "braid/io/inspect.h"

#include <algorithm>

#include <arrow/api.h>
#include <arrow/filesystem/api.h>
#include <arrow/ipc/api.h>
#include <parquet/arrow/reader.h>
#include <parquet/file_reader.h>

#include "braid/io/format_reader_internal.h"
#include "braid/io/megatron_index.h"
#include "braid/io/source_files.h"
#include "braid/io/webdataset_index_internal.h"

namespace braid {
namespace {

int64_t Percentile(std::vector<int64_t>* sorted_lengths, double q) {
  if (sorted_lengths->empty()) return 0;
  const size_t k = static_cast<size_t>(q * static_cast<double>(sorted_lengths->size() - 1));
  return (*sorted_lengths)[k];
}

// The histogram and percentiles of `lengths` into `out`.
void Summarize(std::vector<int64_t> lengths, Inspection* out);

// A Megatron dataset (or several): documents from the index alone, no token read.
Result<Inspection> InspectMegatron(const std::string& path,
                                   std::shared_ptr<arrow::fs::FileSystem> fs,
                                   const std::vector<std::string>& prefixes) {
  Inspection out;
  out.column = "tokens";
  SourceConfig source;
  source.name = "inspect";
  source.path = path;
  source.format = SourceFormat::kMegatron;
  ARROW_ASSIGN_OR_RAISE(auto files, SourceFiles::Open(source, "inspect"));
  std::vector<int64_t> lengths;
  for (size_t i = 0; i < files->files().size(); ++i) {
    const auto& f = files->files()[i];
    InspectedFile inspected;
    inspected.path = f.path;
    inspected.rows = f.num_rows;
    inspected.row_groups = int64_t(f.row_group_rows.size());
    for (const char* ext : {".idx", ".bin"}) {
      auto info = fs->GetFileInfo(prefixes[i] + ext);
      if (info.ok() && info->size() > 0) inspected.bytes += info->size();
    }
    if (out.files.empty()) {
      ARROW_ASSIGN_OR_RAISE(auto idx, fs->OpenInputFile(prefixes[i] + ".idx"));
      ARROW_ASSIGN_OR_RAISE(auto index, MegatronIndex::Open(idx, prefixes[i] + ".idx"));
      out.schema = std::string("tokens: list<") + index->dtype_name() +
                   "> (Megatron indexed dataset, " + std::to_string(index->sequences()) +
                   " sequences, " + std::to_string(index->documents()) + " documents)";
    }
    out.rows += f.num_rows;
    out.files.push_back(inspected);
    for (size_t u = 0; u < f.row_group_rows.size(); ++u) {
      ARROW_ASSIGN_OR_RAISE(auto counts, files->ReadLengths(int(i), int(u)));
      for (const auto& c : *counts) lengths.push_back(c.tokens);
    }
  }
  Summarize(std::move(lengths), &out);
  return out;
}

// JSON Lines files, a save_to_disk folder or WebDataset shards, through SourceFiles: records (rows) and
// units per file, and with a token column its lengths.
Result<Inspection> InspectOther(const std::string& path, SourceFormat format,
                                std::shared_ptr<arrow::fs::FileSystem> fs,
                                const std::vector<std::string>& paths,
                                const std::string& column) {
  Inspection out;
  out.column = column;
  if (format == SourceFormat::kHfArrow) {
    ARROW_ASSIGN_OR_RAISE(auto input, fs->OpenInputFile(paths.front()));
    auto reader = arrow::ipc::RecordBatchStreamReader::Open(input);
    if (!reader.ok()) {
      return DataError(paths.front(), "not an Arrow IPC stream: " +
                                          reader.status().message());
    }
    const auto schema = (*reader)->schema();
    out.schema = schema->ToString(/*show_metadata=*/false);
    if (out.column.empty()) {
      for (const auto& field : schema->fields()) {
        if (IsTokenListType(*field->type())) {
          out.column = field->name();
          break;
        }
      }
    }
  } else if (format == SourceFormat::kWebDataset) {
    auto exts = internal::WebDatasetExtensions(fs.get(), paths.front(), /*samples=*/100);
    if (!exts.ok()) return exts.status();
    std::string list;
    for (const auto& e : *exts) list += (list.empty() ? "" : ", ") + e;
    out.schema = "WebDataset: samples of members grouped by key; member extensions " +
                 std::string("(the first shard's first 100 samples): ") + list;
    // Whether a Megatron-Energon index lists the shards (their counts come from it once
    // it agrees with each shard, checked below as a source opens them).
    ARROW_ASSIGN_OR_RAISE(
        auto indexes,
        internal::FindShardIndexes(fs.get(), paths, internal::IndexSearchRoot(path)));
    int64_t listed = 0;
    std::string info;
    for (const auto& shard : indexes.shards) {
      if (!shard.has_value()) continue;
      if (listed++ == 0) info = shard->info;
    }
    out.schema += listed == 0
                      ? std::string("\nno Megatron-Energon index (.nv-meta): samples are "
                                    "counted from the member headers")
                      : "\nMegatron-Energon index: " + std::to_string(listed) + " of " +
                            std::to_string(paths.size()) + " shards listed in " + info;
    for (const auto& problem : indexes.problems) out.schema += "\n" + problem;
  } else {
    ARROW_ASSIGN_OR_RAISE(auto fields,
                          internal::JsonlFieldTypes(fs.get(), paths.front()));
    out.schema = "JSON Lines: one object per line; fields are read by name. The first "
                 "records' fields (as a transform gets them):";
    for (const auto& [name, type] : fields) {
      out.schema += "\n" + name + ": " + type;
      const bool ids = type == "list<item: int64>" || type == "list<item: int32>";
      if (out.column.empty() && ids) out.column = name;  // the first list of integers
    }
  }
  SourceConfig source;
  source.name = "inspect";
  source.path = path;
  source.format = format;
  std::vector<ColumnSpec> columns;
  if (!out.column.empty()) columns.push_back(TokenColumnSpec(out.column, "--column"));
  ARROW_ASSIGN_OR_RAISE(auto files, SourceFiles::Open(source, "inspect", columns));
  std::vector<int64_t> lengths;
  for (size_t i = 0; i < files->files().size(); ++i) {
    const auto& f = files->files()[i];
    InspectedFile inspected;
    inspected.path = f.path;
    inspected.rows = f.num_rows;
    inspected.row_groups = int64_t(f.row_group_rows.size());
    auto info = fs->GetFileInfo(f.path);
    inspected.bytes = info.ok() ? info->size() : 0;
    out.rows += f.num_rows;
    out.files.push_back(inspected);
    if (out.column.empty()) continue;
    for (size_t u = 0; u < f.row_group_rows.size(); ++u) {
      ARROW_ASSIGN_OR_RAISE(auto counts, files->ReadLengths(int(i), int(u)));
      for (const auto& c : *counts) {
        if (c.null) {
          ++out.nulls;
        } else {
          lengths.push_back(c.tokens);
        }
      }
    }
  }
  Summarize(std::move(lengths), &out);
  return out;
}

}  // namespace

Result<Inspection> Inspect(const std::string& path, const std::string& column) {
  std::shared_ptr<arrow::fs::FileSystem> fs;
  std::vector<std::string> paths;
  SourceFormat format = SourceFormat::kAuto;
  ARROW_RETURN_NOT_OK(ResolveFormatFiles(path, "inspect", &fs, &paths, &format));
  if (format == SourceFormat::kMegatron) return InspectMegatron(path, fs, paths);
  if (format != SourceFormat::kParquet) {
    return InspectOther(path, format, fs, paths, column);
  }
  Inspection out;
  out.column = column;
  std::vector<int64_t> lengths;
  for (const auto& file_path : paths) {
    InspectedFile f;
    f.path = file_path;
    auto info = fs->GetFileInfo(file_path);
    f.bytes = info.ok() ? info->size() : 0;
    ARROW_ASSIGN_OR_RAISE(auto reader, OpenParquet(fs.get(), file_path));
    std::shared_ptr<arrow::Schema> schema;
    const Status st = reader->GetSchema(&schema);
    if (!st.ok()) return DataError(file_path, "cannot read the schema: " + st.message());
    if (out.files.empty()) {
      out.schema = schema->ToString();
      if (out.column.empty()) {
        for (const auto& field : schema->fields()) {
          if (IsTokenListType(*field->type())) {
            out.column = field->name();
            break;
          }
        }
      }
    }
    const auto metadata = reader->parquet_reader()->metadata();
    f.rows = metadata->num_rows();
    f.row_groups = metadata->num_row_groups();
    out.rows += f.rows;
    out.files.push_back(f);
    if (out.column.empty()) continue;
    const int index = schema->GetFieldIndex(out.column);
    if (index < 0) return DataError(file_path, "no column '" + out.column + "'");
    if (!IsTokenListType(*schema->field(index)->type())) {
      return DataError(file_path, "column '" + out.column + "' has type " +
                                      schema->field(index)->type()->ToString() +
                                      ", expected list<int32> or list<int64>");
    }
    for (int rg = 0; rg < metadata->num_row_groups(); ++rg) {
      std::shared_ptr<arrow::ChunkedArray> chunked;
      Status read;
      try {
        read = reader->RowGroup(rg)->Column(index)->Read(&chunked);
      } catch (const std::exception& e) {
        read = Status::IOError(e.what());
      }
      if (!read.ok()) {
        return DataError(DataLocation(file_path, rg, -1), "cannot read column '" +
                                                               out.column + "': " +
                                                               read.message());
      }
      for (const auto& chunk : chunked->chunks()) {
        for (int64_t i = 0; i < chunk->length(); ++i) {
          if (chunk->IsNull(i)) {
            ++out.nulls;
            continue;
          }
          const int64_t n =
              chunk->type_id() == arrow::Type::LIST
                  ? static_cast<const arrow::ListArray&>(*chunk).value_length(i)
                  : static_cast<const arrow::LargeListArray&>(*chunk).value_length(i);
          lengths.push_back(n);
        }
      }
    }
  }
  Summarize(std::move(lengths), &out);
  return out;
}

namespace {

void Summarize(std::vector<int64_t> lengths, Inspection* out_ptr) {
  Inspection& out = *out_ptr;
  for (int64_t n : lengths) {
    if (n == 0) {
      ++out.empty;
      continue;
    }
    out.tokens += n;
    size_t bucket = 0;
    while ((int64_t{2} << bucket) <= n) ++bucket;
    if (out.buckets.size() <= bucket) out.buckets.resize(bucket + 1, 0);
    ++out.buckets[bucket];
  }
  std::sort(lengths.begin(), lengths.end());
  if (!lengths.empty()) {
    out.min_tokens = lengths.front();
    out.max_tokens = lengths.back();
    out.p50_tokens = Percentile(&lengths, 0.5);
    out.p99_tokens = Percentile(&lengths, 0.99);
  }
}

}  // namespace
}  // namespace braid
