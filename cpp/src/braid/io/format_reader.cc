#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include <arrow/api.h>
#include <arrow/io/interfaces.h>
#include <arrow/util/parallel.h>

#include "braid/io/file_lock_internal.h"
#include "braid/io/format_reader_internal.h"
#include "braid/io/retry_internal.h"
#include "braid/util/hash_internal.h"

namespace braid::internal {

Result<std::vector<FormatReader::Columns>> FormatReader::ReadChunks(int file, int unit) {
  ARROW_ASSIGN_OR_RAISE(auto columns, ReadColumns(file, unit));
  return std::vector<Columns>{std::move(columns)};
}

Result<std::vector<RowLength>> FormatReader::ReadLengths(int, int) {
  return Status::NotImplemented("this format has no token counts");
}

Result<std::optional<std::vector<RowLength>>> FormatReader::ReadRowLengths(int, int,
                                                                            int64_t,
                                                                            int64_t) {
  return std::optional<std::vector<RowLength>>();
}

Result<std::optional<std::vector<RowLength>>> ListLengthsOfRows(FormatReader* reader,
                                                                int file, int unit,
                                                                int64_t first,
                                                                int64_t rows) {
  ARROW_ASSIGN_OR_RAISE(auto chunks, reader->ReadRows(file, unit, first, rows));
  std::vector<RowLength> out;
  out.reserve(size_t(rows));
  for (const auto& cols : chunks) {
    const std::vector<RowLength> lengths = ListLengths(*cols.front());
    out.insert(out.end(), lengths.begin(), lengths.end());
  }
  return std::optional<std::vector<RowLength>>(std::move(out));
}

std::string MessageAfterPath(const Status& error, const std::string& path) {
  const std::string prefix = path + ": ";
  std::string message = error.message();
  if (!path.empty() && message.compare(0, prefix.size(), prefix) == 0) {
    message.erase(0, prefix.size());
  }
  return message;
}

void FormatOpen::KeepUnreadable(SourceFiles::File file, const Status& error,
                                const std::string& path) {
  file.unreadable = MessageAfterPath(error, path);
  if (first_unreadable.empty()) first_unreadable = error.message();
  ++unreadable;
  files.push_back(std::move(file));
}

namespace {

// The counts taken in this process, by two 64-bit hashes of KeptCountKey (FNV-1a from two
// starting points; no key text held: about 64 bytes a file for the process's life): a
// source's loaders, its planner stream and its server each open its files, and an
// unchanged file is counted once. Both hashes of two keys agreeing is as unlikely as a
// 128-bit collision for keys nobody chooses to collide (hash_internal.h).
struct CountsInProcess {
  struct KeyHash {
    size_t operator()(const std::pair<uint64_t, uint64_t>& k) const {
      return size_t(k.first);
    }
  };
  std::mutex mu;
  std::unordered_map<std::pair<uint64_t, uint64_t>, std::pair<int64_t, int64_t>, KeyHash>
      counts;
};

CountsInProcess& Counts() {
  static CountsInProcess* counts = new CountsInProcess();  // never destroyed
  return *counts;
}

std::pair<uint64_t, uint64_t> InProcessKey(const std::string& key) {
  return {Fnv1a(key), Fnv1a(key, Fnv1a("\x01"))};
}

std::string CountFile(const std::string& dir, const std::string& key) {
  char name[32];
  std::snprintf(name, sizeof(name), "%016llx.records",
                static_cast<unsigned long long>(Fnv1a(key)));
  return (std::filesystem::path(dir) / name).string();
}

}  // namespace

bool CountKeptInProcess(const std::string& key, int64_t* records, int64_t* bytes) {
  CountsInProcess& kept = Counts();
  std::lock_guard<std::mutex> lock(kept.mu);
  auto it = kept.counts.find(InProcessKey(key));
  if (it == kept.counts.end()) return false;
  *records = it->second.first;
  *bytes = it->second.second;
  return true;
}

void KeepCountInProcess(const std::string& key, int64_t records, int64_t bytes) {
  CountsInProcess& kept = Counts();
  std::lock_guard<std::mutex> lock(kept.mu);
  kept.counts[InProcessKey(key)] = {records, bytes};
}

void ForgetCountsKeptInProcess() {
  CountsInProcess& kept = Counts();
  std::lock_guard<std::mutex> lock(kept.mu);
  kept.counts.clear();
}

Result<std::vector<int64_t>> FormatOpen::AddWholeFiles(
    arrow::fs::FileSystem* fs, const std::vector<std::string>& paths,
    const std::vector<arrow::fs::FileInfo>& stamps, const SourceConfig& source,
    const std::string& tag, const WholeFileCount& count) {
  struct Counted {
    int64_t rows = 0;
    int64_t bytes = 0;
    int tries = 0;
    std::string key;  // KeptCountKey: what keeps the counts of the unchanged file
    Status status;
    Status damage;  // the rows before it were counted (WholeFileCount)
  };
  std::vector<Counted> counted(paths.size());
  const std::string& dir = source.length_cache_dir;
  // With a length cache, processes that open the source at once (a node's embedded
  // ranks) count each file once between them: a file is counted under its lock there;
  // one another process is counting waits (`deferred`) until the others are done, and
  // is then read from the cache (or counted, if that process could not).
  std::vector<char> deferred(paths.size(), 0);
  auto count_one = [&](int i, bool wait) {
    Counted& c = counted[size_t(i)];
    const std::string& path = paths[size_t(i)];
    if (size_t(i) < stamps.size() && stamps[size_t(i)].IsFile()) {
      c.key = KeptCountKey(tag, path, stamps[size_t(i)]);
    }
    auto kept = [&] {
      return !c.key.empty() &&
             (CountKeptInProcess(c.key, &c.rows, &c.bytes) ||
              (!dir.empty() && ReadKeptCount(dir, c.key, &c.rows, &c.bytes)));
    };
    if (kept()) {
      KeepCountInProcess(c.key, c.rows, c.bytes);
      return Status::OK();
    }
    // The file's lock beside its count (left in the folder; it holds nothing). A folder
    // where none can be taken (read-only) locks nothing: each process counts.
    LockFile lock;
    if (!dir.empty() && !c.key.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      auto taken = TakeLock(CountFile(dir, c.key) + ".lock",
                            LOCK_EX | (wait ? 0 : LOCK_NB));
      if (taken.ok() && !taken->held() && !wait) {
        deferred[size_t(i)] = 1;
        return Status::OK();
      }
      if (taken.ok()) lock = std::move(*taken);
      if (kept()) {  // counted by the process that held the lock
        KeepCountInProcess(c.key, c.rows, c.bytes);
        return Status::OK();
      }
    }
    c.status = RetryStorage(
        [&] {
          c.damage = Status::OK();
          return count(size_t(i), &c.rows, &c.bytes, &c.damage);
        },
        kStorageRetryDelaysMs, &c.tries);
    if (c.status.ok() && c.damage.ok() && !c.key.empty()) {
      KeepCountInProcess(c.key, c.rows, c.bytes);
      if (!dir.empty()) WriteKeptCount(dir, c.key, c.rows, c.bytes);
    }
    return Status::OK();  // a file's failure is its own (below), not the loop's
  };
  // The files are counted side by side on Arrow's I/O threads (a count decompresses a
  // file, or reads its headers: round trips on a remote store), then added in path
  // order, so what is kept, and the first error, do not depend on which count ended
  // first.
  ARROW_RETURN_NOT_OK(arrow::internal::OptionalParallelFor(
      paths.size() > 1, static_cast<int>(paths.size()),
      [&](int i) { return count_one(i, /*wait=*/false); },
      arrow::io::default_io_context().executor()));
  std::vector<int> waiting;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (deferred[i]) waiting.push_back(int(i));
  }
  ARROW_RETURN_NOT_OK(arrow::internal::OptionalParallelFor(
      waiting.size() > 1, static_cast<int>(waiting.size()),
      [&](int k) { return count_one(waiting[size_t(k)], /*wait=*/true); },
      arrow::io::default_io_context().executor()));
  std::vector<int64_t> rows(paths.size(), -1);
  for (size_t i = 0; i < paths.size(); ++i) {
    const Counted& c = counted[i];
    SourceFiles::File file;
    file.path = paths[i];
    // A damaged file with no row before the damage is one that did not open.
    const Status& bad = !c.status.ok() ? c.status : c.damage;
    if (!bad.ok() && (source.on_error != OnError::kSkip || c.rows == 0)) {
      if (source.on_error != OnError::kSkip) return RefuseUnreadable(bad, c.tries);
      Status st = bad;
      if (c.tries > 1) st = st.WithMessage(st.message(), " (", c.tries, " tries)");
      KeepUnreadable(std::move(file), st, paths[i]);
      continue;
    }
    if (!c.damage.ok()) file.damaged = MessageAfterPath(c.damage, paths[i]);
    file.row_group_rows = {c.rows};
    file.row_group_first_row = {0};
    file.row_group_bytes = {c.bytes};
    if (!dir.empty() && !c.key.empty()) {
      // What keys the file's cached token lengths: the same file, counted the same.
      file.row_group_digest = {
          Fnv1a(c.key + '|' + std::to_string(c.rows) + '|' + std::to_string(c.bytes))};
    }
    file.column = 0;
    file.num_rows = c.rows;
    files.push_back(std::move(file));
    rows[i] = c.rows;
  }
  return rows;
}

Status RefuseUnreadable(const Status& error, int tries) {
  Status st = error;
  if (tries > 1) st = st.WithMessage(st.message(), " (", tries, " tries)");
  return WithSkipHint(st, "unreadable files");
}

std::vector<RowLength> ListLengths(const arrow::Array& a) {
  std::vector<RowLength> out(static_cast<size_t>(a.length()));
  const bool large = a.type_id() == arrow::Type::LARGE_LIST;
  const auto& values = large ? static_cast<const arrow::LargeListArray&>(a).values()
                             : static_cast<const arrow::ListArray&>(a).values();
  for (int64_t i = 0; i < a.length(); ++i) {
    RowLength& r = out[size_t(i)];
    r.null = a.IsNull(i);
    if (r.null) continue;
    int64_t begin = 0, end = 0;
    if (large) {
      begin = static_cast<const arrow::LargeListArray&>(a).value_offset(i);
      end = static_cast<const arrow::LargeListArray&>(a).value_offset(i + 1);
    } else {
      begin = static_cast<const arrow::ListArray&>(a).value_offset(i);
      end = static_cast<const arrow::ListArray&>(a).value_offset(i + 1);
    }
    r.tokens = end - begin;
    if (values->null_count() > 0) {
      for (int64_t k = begin; k < end; ++k) r.null_values |= values->IsNull(k);
    }
  }
  return out;
}

std::shared_ptr<arrow::DataType> JsonColumnType(const ColumnSpec& spec) {
  const std::shared_ptr<arrow::DataType> candidates[] = {
      arrow::utf8(),
      arrow::list(arrow::int32()),
      // chat messages, {role, content} or ShareGPT's {from, value}, whichever a record
      // holds (the other pair null)
      arrow::list(arrow::struct_({arrow::field("role", arrow::utf8()),
                                  arrow::field("content", arrow::utf8()),
                                  arrow::field("from", arrow::utf8()),
                                  arrow::field("value", arrow::utf8())})),
      arrow::int64(),
  };
  for (const auto& t : candidates) {
    if (spec.check(*t).empty()) return t;
  }
  return nullptr;
}

std::string KeptCountKey(const std::string& tag, const std::string& path,
                         const arrow::fs::FileInfo& info) {
  return tag + '|' + std::to_string(path.size()) + ':' + path + '|' +
         std::to_string(info.size()) + '|' +
         std::to_string(int64_t(info.mtime().time_since_epoch().count()));
}

bool ReadKeptCount(const std::string& dir, const std::string& key, int64_t* records,
                   int64_t* bytes) {
  std::ifstream in(CountFile(dir, key), std::ios::binary);
  std::string line;
  if (!in || !std::getline(in, line) || line != key) return false;
  return static_cast<bool>(in >> *records >> *bytes) && *records >= 0 && *bytes >= 0;
}

void WriteKeptCount(const std::string& dir, const std::string& key, int64_t records,
                    int64_t bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  static std::atomic<uint64_t> counter{0};
  const std::string target = CountFile(dir, key);
  const std::string partial = target + ".partial-" + std::to_string(::getpid()) + "-" +
                              std::to_string(counter.fetch_add(1));
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out << key << '\n' << records << ' ' << bytes << '\n';
    if (!out) {
      out.close();
      std::filesystem::remove(partial, ec);
      return;
    }
  }
  std::filesystem::rename(partial, target, ec);
  if (ec) std::filesystem::remove(partial, ec);
}

}  // namespace braid::internal
