#include "braid/transport/node_builds.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "braid/io/file_lock_internal.h"
#include "braid/util/hash_internal.h"

namespace braid {
namespace stdfs = std::filesystem;

namespace {

constexpr char kMagic[] = "braid-build-1\n";
constexpr size_t kMagicBytes = sizeof(kMagic) - 1;
constexpr int64_t kAlign = 4096;

template <typename T>
void Append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Reads a T at *at of [data, data + size); false past the end.
template <typename T>
bool Take(const uint8_t* data, size_t size, size_t* at, T* v) {
  if (*at > size || size - *at < sizeof(T)) return false;
  std::memcpy(v, data + *at, sizeof(T));
  *at += sizeof(T);
  return true;
}

int64_t Aligned(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A read-only file mapped copy-on-write; unmapped with its last tensor.
struct Mapping {
  uint8_t* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data != nullptr) ::munmap(data, size);
  }
};

std::shared_ptr<Mapping> MapFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st;
  auto map = std::make_shared<Mapping>();
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    void* p = ::mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd,
                     0);
    if (p != MAP_FAILED) {
      map->data = static_cast<uint8_t*>(p);
      map->size = size_t(st.st_size);
    }
  }
  ::close(fd);
  return map->data == nullptr ? nullptr : map;
}

// The header's fields of one tensor.
struct TensorEntry {
  std::string name;
  uint8_t dtype = 0;
  std::vector<int64_t> shape;
  uint64_t offset = 0, bytes = 0;
};

}  // namespace

Result<std::shared_ptr<NodeBuilds>> NodeBuilds::Make(std::string dir,
                                                     int64_t keep_steps) {
  std::error_code ec;
  stdfs::create_directories(dir, ec);
  if (!stdfs::is_directory(dir, ec)) {
    return StorageError(dir, "cannot make the folder for the node's shared builds");
  }
  return std::shared_ptr<NodeBuilds>(
      new NodeBuilds(std::move(dir), std::max<int64_t>(keep_steps, 1)));
}

NodeBuilds::~NodeBuilds() {
  std::error_code ec;
  for (const auto& [key, path] : written_) {
    stdfs::remove(path, ec);
    stdfs::remove(path + ".lock", ec);
  }
  for (const auto& [key, lock] : claimed_) stdfs::remove(lock, ec);
  stdfs::remove(dir_, ec);  // the run's folder, once its last peer's files are gone
}

std::string NodeBuilds::FileFor(int64_t step, int64_t bucket) const {
  char name[64];
  std::snprintf(name, sizeof(name), "s%lld-b%lld.build", static_cast<long long>(step),
                static_cast<long long>(bucket));
  return (stdfs::path(dir_) / name).string();
}

std::optional<std::vector<std::shared_ptr<const Batch>>> NodeBuilds::Find(
    const StepPlan& plan, int64_t bucket) {
  const int64_t step = plan.step;
  const uint64_t digest = BucketDigest(plan, bucket);
  const auto map = MapFile(FileFor(step, bucket));
  if (map == nullptr) return std::nullopt;
  const uint8_t* data = map->data;
  const size_t size = map->size;
  if (size < kMagicBytes || std::memcmp(data, kMagic, kMagicBytes) != 0) {
    return std::nullopt;
  }
  size_t at = kMagicBytes;
  uint64_t header = 0, got_digest = 0, n = 0;
  int64_t got_step = 0, got_bucket = 0;
  if (!Take(data, size, &at, &header) || header > size - at ||
      !Take(data, size, &at, &got_digest) || !Take(data, size, &at, &got_step) ||
      !Take(data, size, &at, &got_bucket) || !Take(data, size, &at, &n) ||
      got_digest != digest || got_step != step || got_bucket != bucket || n > 1 << 20) {
    return std::nullopt;
  }
  std::vector<std::shared_ptr<const Batch>> out;
  for (uint64_t b = 0; b < n; ++b) {
    Batch batch;
    uint64_t tensors = 0;
    if (!Take(data, size, &at, &batch.step) || !Take(data, size, &at, &batch.dp) ||
        !Take(data, size, &at, &batch.micro_batch) || !Take(data, size, &at, &tensors) ||
        tensors > 1024) {
      return std::nullopt;
    }
    for (uint64_t t = 0; t < tensors; ++t) {
      TensorEntry e;
      uint64_t name_bytes = 0, ndim = 0;
      if (!Take(data, size, &at, &name_bytes) || name_bytes > size - at) {
        return std::nullopt;
      }
      e.name.assign(reinterpret_cast<const char*>(data + at), name_bytes);
      at += name_bytes;
      if (!Take(data, size, &at, &e.dtype) || e.dtype > uint8_t(DType::kFloat32) ||
          !Take(data, size, &at, &ndim) || ndim > 8) {
        return std::nullopt;
      }
      e.shape.resize(ndim);
      int64_t elements = 1;
      for (auto& d : e.shape) {
        if (!Take(data, size, &at, &d) || d < 0) return std::nullopt;
        elements *= d;
      }
      if (!Take(data, size, &at, &e.offset) || !Take(data, size, &at, &e.bytes) ||
          e.offset > size || e.bytes > size - e.offset ||
          e.bytes != uint64_t(elements) * DTypeSize(DType(e.dtype))) {
        return std::nullopt;
      }
      Tensor tensor;
      tensor.name = std::move(e.name);
      tensor.dtype = DType(e.dtype);
      tensor.shape = std::move(e.shape);
      tensor.storage = std::make_shared<Bytes>(map->data + e.offset, size_t(e.bytes), map,
                                               /*fd=*/-1, /*offset=*/0);
      batch.tensors.push_back(std::move(tensor));
    }
    out.push_back(std::make_shared<const Batch>(std::move(batch)));
  }
  return out;
}

std::shared_ptr<void> NodeBuilds::Claim(const StepPlan& plan, int64_t bucket,
                                        const std::function<bool()>& stop) {
  const std::string path = FileFor(plan.step, bucket) + ".lock";
  internal::LockFile taken = internal::PollLock(path, stop);
  if (!taken.held()) return nullptr;
  std::vector<std::string> old;  // lock files of steps long built
  {
    std::lock_guard<std::mutex> lock(mu_);
    claimed_[{plan.step, bucket}] = path;
    for (auto it = claimed_.begin(); it != claimed_.end();) {
      if (it->first.first >= plan.step - keep_steps_) break;
      old.push_back(it->second);
      it = claimed_.erase(it);
    }
  }
  std::error_code ec;
  for (const std::string& p : old) stdfs::remove(p, ec);
  return std::make_shared<internal::LockFile>(std::move(taken));
}

void NodeBuilds::Put(const StepPlan& plan, int64_t bucket,
                     const std::vector<std::shared_ptr<const Batch>>& batches) {
  const int64_t step = plan.step;
  const uint64_t digest = BucketDigest(plan, bucket);
  // The header first, with each tensor's place after it.
  std::vector<const Tensor*> tensors;
  for (const auto& b : batches) {
    for (const Tensor& t : b->tensors) tensors.push_back(&t);
  }
  auto header = [&](int64_t data_start) {
    std::string h;
    Append(&h, digest);
    Append(&h, step);
    Append(&h, bucket);
    Append(&h, uint64_t{batches.size()});
    int64_t at = data_start;
    for (const auto& b : batches) {
      Append(&h, b->step);
      Append(&h, b->dp);
      Append(&h, b->micro_batch);
      Append(&h, uint64_t{b->tensors.size()});
      for (const Tensor& t : b->tensors) {
        Append(&h, uint64_t{t.name.size()});
        h += t.name;
        Append(&h, uint8_t(t.dtype));
        Append(&h, uint64_t{t.shape.size()});
        for (int64_t d : t.shape) Append(&h, d);
        Append(&h, uint64_t(at));
        Append(&h, uint64_t{t.storage->size()});
        at = Aligned(at + int64_t(t.storage->size()));
      }
    }
    return h;
  };
  const int64_t header_bytes = int64_t(header(0).size());
  const int64_t data_start = Aligned(int64_t(kMagicBytes) + 8 + header_bytes);
  const std::string h = header(data_start);
  const std::string target = FileFor(step, bucket);
  const std::string partial = target + ".partial-" + std::to_string(::getpid());
  std::error_code ec;
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) return;
    out.write(kMagic, std::streamsize(kMagicBytes));
    const uint64_t length = h.size();
    out.write(reinterpret_cast<const char*>(&length), sizeof(length));
    out << h;
    int64_t at = int64_t(kMagicBytes) + 8 + int64_t(h.size());
    const std::string pad(size_t(kAlign), '\0');
    for (const Tensor* t : tensors) {
      const int64_t begin = Aligned(at);
      out.write(pad.data(), std::streamsize(begin - at));
      out.write(reinterpret_cast<const char*>(t->storage->data()),
                std::streamsize(t->storage->size()));
      at = begin + int64_t(t->storage->size());  // the first begins at data_start
    }
    if (!out) {
      out.close();
      stdfs::remove(partial, ec);
      return;
    }
  }
  stdfs::rename(partial, target, ec);
  if (ec) {
    stdfs::remove(partial, ec);
    return;
  }
  std::vector<std::string> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    written_[{step, bucket}] = target;
    for (auto it = written_.begin(); it != written_.end();) {
      if (it->first.first >= step - keep_steps_) break;
      old.push_back(it->second);
      it = written_.erase(it);
    }
  }
  for (const std::string& path : old) {
    stdfs::remove(path, ec);
    stdfs::remove(path + ".lock", ec);
  }

}

uint64_t BucketDigest(const StepPlan& plan, int64_t bucket) {
  std::string keys;
  Append(&keys, plan.step);
  Append(&keys, bucket);
  for (const MicroBatch& mb : plan.buckets[size_t(bucket)].micro_batches) {
    Append(&keys, int64_t{-1});  // a micro-batch begins
    for (const Sequence& seq : mb.sequences) {
      Append(&keys, int64_t{-2});  // a sequence begins
      for (const DocPiece& d : seq.docs) {
        Append(&keys, d.source);
        Append(&keys, d.file);
        Append(&keys, d.row);
        Append(&keys, d.epoch);
        Append(&keys, d.start);
        Append(&keys, d.len);
        Append(&keys, d.doc_tokens);
      }
    }
  }
  return internal::Fnv1a(keys);
}

std::string NodeBuildsFolder(const std::string& fingerprint) {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v == nullptr ? "" : v);
  };
  std::string run = env("TORCHELASTIC_RUN_ID");
  if (run.empty() && !env("MASTER_PORT").empty()) {
    run = env("MASTER_ADDR") + ":" + env("MASTER_PORT");
  }
  if (run.empty() && !env("SLURM_JOB_ID").empty()) {
    run = env("SLURM_JOB_ID") + "." + env("SLURM_STEP_ID");
  }
  if (run.empty()) return "";
  std::error_code ec;
  const stdfs::path base = stdfs::is_directory("/dev/shm", ec)
                               ? stdfs::path("/dev/shm")
                               : stdfs::temp_directory_path(ec);
  char name[64];
  std::snprintf(name, sizeof(name), "braid-builds-%u/%016llx", unsigned(::getuid()),
                static_cast<unsigned long long>(
                    internal::Fnv1a(run, internal::Fnv1a(fingerprint))));
  return (base / name).string();
}

}  // namespace braid
