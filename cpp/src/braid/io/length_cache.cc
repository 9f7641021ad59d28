#include "braid/io/length_cache.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "braid/util/hash_internal.h"

namespace braid {
namespace stdfs = std::filesystem;

namespace {

constexpr char kMagic[] = "braid-lengths-1\n";  // the format; a new one is a new magic
constexpr size_t kMagicBytes = sizeof(kMagic) - 1;

// The whole file, or nullopt if it cannot be read.
std::optional<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return std::nullopt;
  const std::streamoff size = in.tellg();
  if (size < 0) return std::nullopt;
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), size)) return std::nullopt;
  return bytes;
}

// A hash of a file's bytes; the file must exist and be readable.
Result<uint64_t> FileBytesHash(const std::string& path, const std::string& key) {
  const auto bytes = ReadAll(path);
  if (!bytes) {
    return ConfigError(key, "cannot read " + path + " (for runtime.length_cache)");
  }
  return internal::Fnv1a(*bytes);
}

// What turns a row of this tokenizer's source into its count.
Result<std::string> TokenizerIdentity(const TokenizerConfig& t) {
  std::ostringstream os;
  os << "tok=" << t.type << ':' << t.bos << t.eos << ':' << t.add_special_tokens << ':'
     << t.bos_token.size() << ':' << t.bos_token << ':' << t.eos_token.size() << ':'
     << t.eos_token << ':' << t.chat_template;
  ARROW_ASSIGN_OR_RAISE(uint64_t model, FileBytesHash(t.model, t.key));
  os << ":model=" << model;
  if (t.huggingface()) {  // its chat template lives beside it
    const stdfs::path config =
        stdfs::path(t.model).parent_path() / "tokenizer_config.json";
    std::error_code ec;
    if (stdfs::exists(config, ec)) {
      ARROW_ASSIGN_OR_RAISE(uint64_t h, FileBytesHash(config.string(), t.key));
      os << ":config=" << h;
    }
  }
  return os.str();
}

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
bool Take(const std::string& in, size_t* at, T* v) {
  if (in.size() - *at < sizeof(T)) return false;
  std::memcpy(v, in.data() + *at, sizeof(T));
  *at += sizeof(T);
  return true;
}

}  // namespace

Result<std::unique_ptr<LengthCache>> LengthCache::Make(const Config& config,
                                                       int32_t source_index) {
  const SourceConfig& s = config.sources[size_t(source_index)];
  if (s.length_cache_dir.empty() || !Keeps(s)) return nullptr;
  std::ostringstream os;
  os << "text=" << s.text_column << "|chat=" << s.chat.prompt_column << ','
     << s.chat.response_column << ',' << s.chat.messages_column;
  if (!s.image_column.empty()) {
    os << "|image=" << s.image_column << ',' << s.image_patch_size << ','
       << s.image_max_pixels << ',' << s.image_token_id;
  }
  ARROW_ASSIGN_OR_RAISE(std::string tok,
                        TokenizerIdentity(config.TokenizerFor(size_t(source_index))));
  os << '|' << tok;
  return std::unique_ptr<LengthCache>(new LengthCache(s.length_cache_dir, os.str()));
}

bool LengthCache::Keeps(const SourceConfig& s) {
  // Not a token column (its counts are levels or a length column), not a user function
  // (its code is in no key).
  return !s.user_transform.enabled() && (!s.text_column.empty() || s.chat.enabled());
}

std::string LengthCache::Key(const LengthCacheEntry& e) const {
  return identity_ + "|file=" + std::to_string(e.path.size()) + ':' + e.path + "|rg=" +
         std::to_string(e.row_group) + ',' + std::to_string(e.digest) + "|block=" +
         std::to_string(e.block_rows) + ',' + std::to_string(e.block);
}

std::string LengthCache::FileFor(const std::string& key) const {
  char name[24];
  std::snprintf(name, sizeof(name), "%016llx.lens",
                static_cast<unsigned long long>(internal::Fnv1a(key)));
  return (stdfs::path(dir_) / name).string();
}

std::optional<std::vector<CachedRow>> LengthCache::Read(
    const LengthCacheEntry& entry) const {
  const std::string key = Key(entry);
  const auto read = ReadAll(FileFor(key));
  if (!read) return std::nullopt;
  const std::string& bytes = *read;
  if (bytes.compare(0, kMagicBytes, kMagic) != 0) return std::nullopt;
  size_t at = kMagicBytes;
  uint64_t key_bytes = 0, n = 0;
  if (!Take(bytes, &at, &key_bytes) || bytes.size() - at < key_bytes ||
      bytes.compare(at, key_bytes, key) != 0 || key_bytes != key.size()) {
    return std::nullopt;  // another key with the same hash, or a damaged file
  }
  at += key_bytes;
  constexpr size_t kRowBytes = 3 * sizeof(int64_t) + sizeof(int8_t);
  if (!Take(bytes, &at, &n) || n > (bytes.size() - at) / kRowBytes ||
      bytes.size() - at != n * kRowBytes) {
    return std::nullopt;
  }
  std::vector<CachedRow> rows(n);
  for (CachedRow& r : rows) {
    int8_t skip = 0;
    Take(bytes, &at, &r.tokens);
    Take(bytes, &at, &r.image_tokens);
    Take(bytes, &at, &r.estimate_bytes);
    Take(bytes, &at, &skip);
    if (skip < 0 || skip > static_cast<int8_t>(SkipReason::kError) || r.tokens < 0 ||
        r.image_tokens < 0 || r.image_tokens > r.tokens || r.estimate_bytes < 0) {
      return std::nullopt;
    }
    r.skip = static_cast<SkipReason>(skip);
  }
  return rows;
}

void LengthCache::Write(const LengthCacheEntry& entry,
                        const std::vector<CachedRow>& rows) const {
  const std::string key = Key(entry);
  std::string bytes(kMagic, kMagicBytes);
  Put(&bytes, uint64_t{key.size()});
  bytes += key;
  Put(&bytes, uint64_t{rows.size()});
  for (const CachedRow& r : rows) {
    Put(&bytes, r.tokens);
    Put(&bytes, r.image_tokens);
    Put(&bytes, r.estimate_bytes);
    Put(&bytes, static_cast<int8_t>(r.skip));
  }
  std::error_code ec;
  stdfs::create_directories(dir_, ec);
  const std::string target = FileFor(key);
  static std::atomic<uint64_t> counter{0};
  const std::string partial = target + ".partial-" + std::to_string(::getpid()) + "-" +
                              std::to_string(counter.fetch_add(1));
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) return;
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      out.close();
      stdfs::remove(partial, ec);
      return;
    }
  }
  stdfs::rename(partial, target, ec);
  if (ec) stdfs::remove(partial, ec);
}

internal::LockFile LengthCache::Lock(const LengthCacheEntry& entry,
                                     const std::atomic<bool>& stop) const {
  std::error_code ec;
  stdfs::create_directories(dir_, ec);
  return internal::PollLock(FileFor(Key(entry)) + ".lock",
                            [&stop] { return stop.load(std::memory_order_relaxed); });
}

}  // namespace braid
