// Source formats: what a source's file names say about how its files are laid out
// (docs/sources.md, "Formats"). Pure functions of the names, except
// IsLocalMegatronPrefix, which looks at the local disk.
//
// Thread-safe.
#pragma once

#include <string>
#include <vector>

#include "braid/config/config.h"

namespace braid {

/// The format a path's name says: `.parquet` kParquet; `.idx` / `.bin` kMegatron;
/// `.jsonl`, `.json` (each optionally `.gz` / `.zst`) kJsonl; `.arrow` kHfArrow;
/// `.tar`, `.tar.gz`, `.tgz` kWebDataset; any
/// other name (a directory, a glob without one of these endings, a prefix) kAuto.
/// A URI's query (`?endpoint_override=...`) is not part of the name.
SourceFormat DetectFormatFromName(const std::string& path);

/// True if `name` ends in one of the endings of `format` (kAuto: none).
bool HasFormatSuffix(const std::string& name, SourceFormat format);

/// True for a local path P (no URI scheme, no glob) that is not a file itself while P.idx
/// is: the prefix of a Megatron dataset.
bool IsLocalMegatronPrefix(const std::string& path);

/// True for a path that may name several datasets: a URI, a glob, or a local directory.
bool MayListDatasets(const std::string& path);

/// The endings of `format`, for messages ("*.parquet", "*.idx", ...).
std::string FormatSuffixList(SourceFormat format);

}  // namespace braid
