// Megatron-Energon's WebDataset index (webdataset_index_internal.h): finding a shard's
// prepared folder, reading its info file, checking a shard's .tar.idx.
#include "braid/io/webdataset_index_internal.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include <arrow/api.h>
#include <arrow/util/endian.h>

#include "braid/io/source_files_internal.h"

namespace braid::internal {
namespace {

constexpr const char* kMetaFolder = ".nv-meta";
constexpr const char* kIdxSuffix = ".idx";  // SHARD.tar -> SHARD.tar.idx
// The end-of-archive blocks after the last offset that CheckShardIndex reads.
constexpr int64_t kEndBytes = 1024;

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() &&
         s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The folders whose .nv-meta may index `shard`, nearest first: its own and those above
// it down to `root`'s length (only its own when `shard` is not below `root`).
std::vector<std::string> Candidates(const std::string& shard, const std::string& root) {
  std::vector<std::string> out;
  std::string dir = Parent(shard);
  const bool below = shard.size() > root.size() &&
                     shard.compare(0, root.size(), root) == 0 &&
                     (root.empty() || root.back() == '/' || shard[root.size()] == '/');
  while (!dir.empty()) {
    out.push_back(dir);
    if (!below || dir.size() <= root.size()) break;
    dir = Parent(dir);
  }
  return out;
}

Result<std::string> ReadWhole(arrow::fs::FileSystem* fs, const std::string& path) {
  auto file = fs->OpenInputFile(path);
  if (!file.ok()) return StorageError(path, OneLine(file.status().message()));
  auto size = (*file)->GetSize();
  if (!size.ok()) return StorageError(path, OneLine(size.status().message()));
  auto buffer = (*file)->ReadAt(0, *size);
  if (!buffer.ok()) return StorageError(path, OneLine(buffer.status().message()));
  return (*buffer)->ToString();
}

// One prepared folder: its info file and `shard_counts`, or why it cannot be used.
struct Folder {
  std::string info;  // "" when the folder holds no index
  std::map<std::string, int64_t> counts;
  std::string broken;  // why the info file gives no counts
};

// `text` of `info` (.info.json: nlohmann::json; .info.yaml: yaml-cpp) into `*f`.
void ParseInfo(const std::string& info, const std::string& text, Folder* f) {
  f->info = info;
  const std::string not_counts =
      "its shard_counts is not a map of shard names to sample counts";
  if (EndsWith(info, ".json")) {
    const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      f->broken = "it is not JSON";
      return;
    }
    if (!j.is_object() || !j.contains("shard_counts") || !j["shard_counts"].is_object()) {
      f->broken = not_counts;
      return;
    }
    for (const auto& [name, count] : j["shard_counts"].items()) {
      if (!count.is_number_integer() || count.get<int64_t>() < 0) {
        f->broken = not_counts + " ('" + name + "')";
        return;
      }
      f->counts[name] = count.get<int64_t>();
    }
    return;
  }
  try {
    const YAML::Node root = YAML::Load(text);
    const YAML::Node counts = root.IsMap() ? root["shard_counts"] : YAML::Node();
    if (!counts.IsMap()) {
      f->broken = not_counts;
      return;
    }
    for (const auto& kv : counts) {
      const auto name = kv.first.as<std::string>();
      const auto count = kv.second.as<int64_t>();
      if (count < 0) {
        f->broken = not_counts + " ('" + name + "')";
        return;
      }
      f->counts[name] = count;
    }
  } catch (const YAML::Exception& e) {
    f->broken = "it is not YAML of that form (" + OneLine(e.msg) + ")";
    f->counts.clear();
  }
}

Result<Folder> ReadFolder(arrow::fs::FileSystem* fs, const std::string& dir) {
  Folder f;
  const std::string meta = dir + "/" + kMetaFolder + "/";
  auto infos = fs->GetFileInfo(std::vector<std::string>{meta + ".info.json",
                                                        meta + ".info.yaml"});
  if (!infos.ok()) return StorageError(meta, OneLine(infos.status().message()));
  for (const auto& info : *infos) {
    if (!info.IsFile()) continue;
    ARROW_ASSIGN_OR_RAISE(const std::string text, ReadWhole(fs, info.path()));
    ParseInfo(info.path(), text, &f);
    break;  // .info.json first, as Energon reads them
  }
  return f;
}

uint64_t LittleEndian64(const uint8_t* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, sizeof(v));
  return arrow::bit_util::FromLittleEndian(v);
}

}  // namespace

std::string IndexSearchRoot(const std::string& source_path) {
  std::string p = source_path;
  const size_t scheme = p.find("://");
  if (scheme != std::string::npos) {
    p = p.substr(scheme + 3);
    p = p.substr(0, p.find('?'));
  }
  const size_t glob = p.find_first_of("*?[{");
  if (glob != std::string::npos) p = Parent(p.substr(0, glob));
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

Result<ShardIndexes> FindShardIndexes(arrow::fs::FileSystem* fs,
                                      const std::vector<std::string>& paths,
                                      const std::string& root) {
  ShardIndexes out;
  out.shards.resize(paths.size());
  std::map<std::string, Folder> folders;
  std::map<std::string, std::vector<std::string>> unlisted;  // info file -> shards
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string& path = paths[i];
    if (!EndsWith(path, ".tar")) continue;  // a compressed tar has no offsets to enter at
    for (const auto& dir : Candidates(path, root)) {
      auto it = folders.find(dir);
      if (it == folders.end()) {
        ARROW_ASSIGN_OR_RAISE(Folder f, ReadFolder(fs, dir));
        it = folders.emplace(dir, std::move(f)).first;
      }
      const Folder& f = it->second;
      if (f.info.empty()) continue;
      if (!f.broken.empty()) break;  // said once below
      const auto count = f.counts.find(path.substr(dir.size() + 1));
      if (count == f.counts.end()) {
        unlisted[f.info].push_back(path);
      } else {
        out.shards[i] = ShardIndex{f.info, path + kIdxSuffix, count->second};
      }
      break;
    }
  }
  for (const auto& [dir, f] : folders) {
    if (!f.broken.empty()) {
      out.problems.push_back(f.info + " is not Energon's index (" + f.broken +
                             "): the shards below " + dir + " are counted from their " +
                             "member headers");
    }
  }
  for (const auto& [info, shards] : unlisted) {
    std::string names;
    for (size_t k = 0; k < shards.size() && k < 3; ++k) {
      names += (k ? ", " : "") + shards[k];
    }
    if (shards.size() > 3) names += ", ...";
    out.problems.push_back(info + " does not list " + std::to_string(shards.size()) +
                           " of the source's shards (" + names + "; a stale index: run " +
                           "energon prepare again): they are counted from their member " +
                           "headers");
  }
  return out;
}

Result<std::string> CheckShardIndex(arrow::fs::FileSystem* fs, const std::string& shard,
                                    const ShardIndex& index, int64_t* span_bytes) {
  *span_bytes = 0;
  auto idx_info = fs->GetFileInfo(index.idx);
  if (!idx_info.ok()) {
    return StorageError(index.idx, OneLine(idx_info.status().message()));
  }
  if (!idx_info->IsFile()) return "it has no " + index.idx;
  auto idx_file = fs->OpenInputFile(*idx_info);
  if (!idx_file.ok()) {
    return StorageError(index.idx, OneLine(idx_file.status().message()));
  }
  std::vector<int64_t> offsets;
  ARROW_ASSIGN_OR_RAISE(std::string problem,
                        ReadSampleOffsets(idx_file->get(), index.idx, index.samples, 0,
                                          index.samples, &offsets));
  if (!problem.empty()) return index.idx + ": " + problem;
  const int64_t end = offsets.back();
  auto file = fs->OpenInputFile(shard);
  if (!file.ok()) return StorageError(shard, OneLine(file.status().message()));
  auto size = (*file)->GetSize();
  if (!size.ok()) return StorageError(shard, OneLine(size.status().message()));
  if (end > *size) {
    return "the last offset of " + index.idx + " (" + std::to_string(end) +
           ") is past the shard's size (" + std::to_string(*size) + " bytes)";
  }
  if (end < *size) {
    auto tail = (*file)->ReadAt(end, std::min(kEndBytes, *size - end));
    if (!tail.ok()) return StorageError(shard, OneLine(tail.status().message()));
    const uint8_t* b = (*tail)->data();
    if (!std::all_of(b, b + (*tail)->size(), [](uint8_t c) { return c == 0; })) {
      return "the shard's archive does not end at the last offset of " + index.idx +
             " (" + std::to_string(end) + "): more members follow";
    }
  }
  *span_bytes = end - offsets.front();
  return std::string();
}

Result<std::string> ReadSampleOffsets(arrow::io::RandomAccessFile* idx,
                                      const std::string& path, int64_t samples,
                                      int64_t first, int64_t n,
                                      std::vector<int64_t>* out) {
  out->clear();
  auto size = idx->GetSize();
  if (!size.ok()) return StorageError(path, OneLine(size.status().message()));
  if (*size != (samples + 1) * 8) {
    return "it holds " + std::to_string(*size / 8) + " offsets" +
           (*size % 8 != 0 ? " and " + std::to_string(*size % 8) + " bytes" : "") +
           " where the info file's " + std::to_string(samples) + " samples need " +
           std::to_string(samples + 1);
  }
  auto read = idx->ReadAt(first * 8, (n + 1) * 8);
  if (!read.ok()) return StorageError(path, OneLine(read.status().message()));
  const auto& bytes = *read;
  if (bytes->size() != (n + 1) * 8) return std::string("it ends early");
  out->resize(size_t(n + 1));
  for (int64_t k = 0; k <= n; ++k) {
    const uint64_t v = LittleEndian64(bytes->data() + k * 8);
    (*out)[size_t(k)] = v > uint64_t{INT64_MAX} ? -1 : int64_t(v);
    if ((*out)[size_t(k)] < 0 || (k > 0 && (*out)[size_t(k)] <= (*out)[size_t(k - 1)])) {
      return "its offsets do not increase (sample " + std::to_string(first + k) + ": " +
             std::to_string(v) + ")";
    }
  }
  return std::string();
}

}  // namespace braid::internal
