#include "braid/testing/formats_fixture.h"

#include <archive.h>
#include <archive_entry.h>

#include <cstdio>
#include <filesystem>

namespace braid::testing {

Result<std::vector<int64_t>> WriteTarShard(const std::string& path,
                                           const TarMembers& members, bool gzip) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  archive* a = archive_write_new();
  if (a == nullptr) return Status::OutOfMemory("libarchive");
  auto fail = [&](const std::string& what) {
    const std::string why = archive_error_string(a) ? archive_error_string(a) : "";
    archive_write_free(a);
    return Status::IOError(path, ": ", what, ": ", why);
  };
  archive_write_set_format_pax_restricted(a);
  if (gzip && archive_write_add_filter_gzip(a) != ARCHIVE_OK) return fail("gzip");
  if (archive_write_open_filename(a, path.c_str()) != ARCHIVE_OK) return fail("open");
  std::vector<int64_t> starts;
  std::string last_key;
  for (const auto& [name, bytes] : members) {
    const std::string key = name.substr(0, name.find('.'));
    // -1: the bytes the tar format wrote, before any compression.
    if (key != last_key) starts.push_back(archive_filter_bytes(a, -1));
    last_key = key;
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_size(e, la_int64_t(bytes.size()));
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    const bool ok = archive_write_header(a, e) == ARCHIVE_OK &&
                    archive_write_data(a, bytes.data(), bytes.size()) ==
                        la_ssize_t(bytes.size()) &&
                    archive_write_finish_entry(a) == ARCHIVE_OK;
    archive_entry_free(e);
    if (!ok) return fail("member " + name);
  }
  starts.push_back(archive_filter_bytes(a, -1));
  if (archive_write_close(a) != ARCHIVE_OK) return fail("close");
  archive_write_free(a);
  return starts;
}

std::string SampleKey(int64_t i) {
  char name[24];
  std::snprintf(name, sizeof(name), "%06lld", static_cast<long long>(i));
  return name;
}

std::vector<int32_t> SampleIds(int64_t i) {
  std::vector<int32_t> out;
  for (int64_t k = 0; k <= i % 9; ++k) out.push_back(static_cast<int32_t>(i * 100 + k));
  return out;
}

std::string SampleIdsJson(int64_t i) {
  std::string out = "[";
  for (int32_t id : SampleIds(i)) out += (out.size() > 1 ? "," : "") + std::to_string(id);
  return out + "]";
}

std::vector<int32_t> ListRowIds(const arrow::Array& list, int64_t i) {
  const auto& l = static_cast<const arrow::ListArray&>(list);
  const auto& v = static_cast<const arrow::Int32Array&>(*l.values());
  std::vector<int32_t> out;
  for (int64_t k = l.value_offset(i); k < l.value_offset(i + 1); ++k) {
    out.push_back(v.Value(k));
  }
  return out;
}

}  // namespace braid::testing
