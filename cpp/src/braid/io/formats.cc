// Source formats from names (formats.h).
//
// Thread-safe.
#include "braid/io/formats.h"

#include <sys/stat.h>

namespace braid {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The name without a URI's query.
std::string NamePart(const std::string& path) {
  const size_t scheme = path.find("://");
  if (scheme == std::string::npos) return path;
  return path.substr(0, path.find('?'));
}

const std::vector<std::string>& Suffixes(SourceFormat format) {
  static const std::vector<std::string> parquet = {".parquet"};
  static const std::vector<std::string> megatron = {".idx", ".bin"};
  static const std::vector<std::string> jsonl = {".jsonl",     ".json",     ".jsonl.gz",
                                                 ".json.gz",   ".jsonl.zst", ".json.zst"};
  static const std::vector<std::string> arrow = {".arrow"};
  static const std::vector<std::string> tar = {".tar", ".tar.gz", ".tgz"};
  static const std::vector<std::string> none;
  switch (format) {
    case SourceFormat::kParquet: return parquet;
    case SourceFormat::kMegatron: return megatron;
    case SourceFormat::kJsonl: return jsonl;
    case SourceFormat::kHfArrow: return arrow;
    case SourceFormat::kWebDataset: return tar;
    case SourceFormat::kAuto: break;
  }
  return none;
}

}  // namespace

bool HasFormatSuffix(const std::string& name, SourceFormat format) {
  for (const auto& s : Suffixes(format)) {
    if (EndsWith(name, s)) return true;
  }
  return false;
}

SourceFormat DetectFormatFromName(const std::string& path) {
  const std::string name = NamePart(path);
  for (SourceFormat f : {SourceFormat::kParquet, SourceFormat::kMegatron,
                         SourceFormat::kJsonl, SourceFormat::kHfArrow,
                         SourceFormat::kWebDataset}) {
    if (HasFormatSuffix(name, f)) return f;
  }
  return SourceFormat::kAuto;
}

bool IsLocalMegatronPrefix(const std::string& path) {
  if (path.empty() || path.find("://") != std::string::npos ||
      path.find_first_of("*?[") != std::string::npos) {
    return false;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return false;  // the path itself exists
  return ::stat((path + ".idx").c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool MayListDatasets(const std::string& path) {
  if (path.find("://") != std::string::npos || path.find_first_of("*?[") != std::string::npos) {
    return true;
  }
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string FormatSuffixList(SourceFormat format) {
  std::string out;
  for (const auto& s : Suffixes(format)) out += (out.empty() ? "*" : ", *") + s;
  return out;
}

}  // namespace braid
