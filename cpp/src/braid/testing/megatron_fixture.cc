#include "braid/testing/megatron_fixture.h"

#include <cstring>
#include <fstream>

namespace braid::testing {
namespace {

int ItemBytes(int code) {
  switch (code) {
    case 1: case 2: return 1;
    case 3: case 8: return 2;
    case 5: return 8;
    default: return 4;
  }
}

template <typename T>
void Put(std::ofstream& out, T v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

Status WriteMegatronDataset(const std::string& prefix,
                            const std::vector<std::vector<int32_t>>& docs,
                            const MegatronOptions& options) {
  const int item = ItemBytes(options.dtype_code);
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers;
  std::vector<int64_t> doc_indices = {0};
  std::ofstream bin(prefix + ".bin", std::ios::binary | std::ios::trunc);
  if (!bin) return Status::IOError("cannot write ", prefix, ".bin");
  int64_t at = 0;
  for (const auto& d : docs) {
    const size_t k = size_t(std::max(1, options.sequences_per_document));
    const size_t per = (d.size() + k - 1) / k;
    for (size_t s = 0; s < k; ++s) {
      const size_t begin = std::min(d.size(), s * per);
      const size_t end = std::min(d.size(), begin + per);
      lengths.push_back(int32_t(end - begin));
      pointers.push_back(at);
      for (size_t i = begin; i < end; ++i) {
        switch (item) {
          case 1: Put<uint8_t>(bin, uint8_t(d[i])); break;
          case 2: Put<uint16_t>(bin, uint16_t(d[i])); break;
          case 8: Put<int64_t>(bin, int64_t(d[i])); break;
          default: Put<int32_t>(bin, d[i]); break;
        }
      }
      at += int64_t(end - begin) * item;
    }
    doc_indices.push_back(int64_t(lengths.size()));
  }
  std::ofstream idx(prefix + ".idx", std::ios::binary | std::ios::trunc);
  if (!idx) return Status::IOError("cannot write ", prefix, ".idx");
  idx.write("MMIDIDX\0\0", 9);
  Put<uint64_t>(idx, 1);
  Put<uint8_t>(idx, uint8_t(options.dtype_code));
  Put<uint64_t>(idx, lengths.size());
  Put<uint64_t>(idx, doc_indices.size());
  idx.write(reinterpret_cast<const char*>(lengths.data()), std::streamsize(lengths.size() * 4));
  idx.write(reinterpret_cast<const char*>(pointers.data()),
            std::streamsize(pointers.size() * 8));
  idx.write(reinterpret_cast<const char*>(doc_indices.data()),
            std::streamsize(doc_indices.size() * 8));
  if (!idx || !bin) return Status::IOError("cannot write ", prefix);
  return Status::OK();
}

}  // namespace braid::testing
