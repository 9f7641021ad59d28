// loader_example CONFIG [MICRO_BATCHES]: Braid's C++ API end to end (docs/cpp-api.md).
//
// Loads CONFIG, makes a Loader for rank 0 of a one-rank job (topology dp=tp=pp=cp=1),
// takes MICRO_BATCHES (default 4) micro-batches and prints each one's place, tensor
// shapes, real tokens and a checksum. It then saves the state after the first half,
// makes a second Loader from that state, and checks that it returns the second half
// again, byte for byte. Exits 0 on success, 1 on a Braid error, 3 if the resumed stream
// differs, 2 on bad arguments.
//
// Uses nothing but <braid/braid.h> and the standard library.
#include <braid/braid.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

// FNV-1a over the batch's place and every tensor's name, shape and bytes.
uint64_t Checksum(const braid::Batch& batch) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  mix(&batch.step, sizeof(batch.step));
  mix(&batch.micro_batch, sizeof(batch.micro_batch));
  for (const braid::Tensor& t : batch.tensors) {
    mix(t.name.data(), t.name.size());
    mix(t.shape.data(), t.shape.size() * sizeof(int64_t));
    mix(t.storage->data(), t.storage->size());
  }
  return h;
}

std::string Shape(const braid::Tensor& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.shape.size(); ++i) {
    s += (i ? "," : "") + std::to_string(t.shape[i]);
  }
  return s + "]";
}

void Print(const braid::Batch& batch) {
  std::printf("step %lld micro-batch %lld:", static_cast<long long>(batch.step),
              static_cast<long long>(batch.micro_batch));
  for (const braid::Tensor& t : batch.tensors) {
    std::printf(" %s%s:%s", t.name.c_str(), Shape(t).c_str(), braid::ToString(t.dtype));
  }
  // Real (not padding) tokens: loss_mask is 1.0 where a label is trained on.
  if (const braid::Tensor* mask = batch.Find("loss_mask")) {
    int64_t real = 0;
    for (int64_t i = 0; i < mask->num_elements(); ++i) real += mask->data<float>()[i] > 0;
    std::printf(" tokens %lld/%lld", static_cast<long long>(real),
                static_cast<long long>(mask->num_elements()));
  }
  std::printf(" checksum %016llx\n", static_cast<unsigned long long>(Checksum(batch)));
}

// Takes `n` micro-batches from `loader`.
braid::Result<std::vector<std::shared_ptr<const braid::Batch>>> Take(
    braid::Loader& loader, int64_t n) {
  std::vector<std::shared_ptr<const braid::Batch>> out;
  for (int64_t i = 0; i < n; ++i) {
    ARROW_ASSIGN_OR_RAISE(std::shared_ptr<const braid::Batch> batch, loader.Next());
    out.push_back(std::move(batch));
  }
  return out;
}

// 0: the resumed stream matches; 3: it differs.
braid::Result<int> Run(const std::string& config_path, int64_t n) {
  ARROW_ASSIGN_OR_RAISE(braid::JobConfig config, braid::JobConfig::FromFile(config_path));
  const braid::TopologySizes topo = config.topology();
  std::printf(
      "config %s: %lld sources, seq_len %lld, micro-batch %lld, "
      "topology dp %lld tp %lld pp %lld cp %lld, fingerprint %s\n",
      config_path.c_str(), static_cast<long long>(config.num_sources()),
      static_cast<long long>(config.seq_len()),
      static_cast<long long>(config.micro_batch_size()), static_cast<long long>(topo.dp),
      static_cast<long long>(topo.tp), static_cast<long long>(topo.pp),
      static_cast<long long>(topo.cp), config.Fingerprint().c_str());

  braid::Loader::Options options;
  options.rank = 0;
  options.world_size = 1;
  ARROW_ASSIGN_OR_RAISE(std::unique_ptr<braid::Loader> loader,
                        braid::Loader::Make(config, options));
  const int64_t half = n / 2;
  ARROW_ASSIGN_OR_RAISE(auto first, Take(*loader, half));
  const std::string state = loader->StateJson();
  ARROW_ASSIGN_OR_RAISE(auto second, Take(*loader, n - half));
  loader->Stop();
  for (const auto& b : first) Print(*b);
  for (const auto& b : second) Print(*b);
  std::printf("state after %lld micro-batches: %zu bytes of JSON\n",
              static_cast<long long>(half), state.size());

  options.state_json = state;
  ARROW_ASSIGN_OR_RAISE(std::unique_ptr<braid::Loader> resumed,
                        braid::Loader::Make(config, options));
  ARROW_ASSIGN_OR_RAISE(auto again, Take(*resumed, n - half));
  int rc = 0;
  for (size_t i = 0; i < again.size(); ++i) {
    const braid::Batch &a = *second[i], &b = *again[i];
    if (a.step != b.step || a.micro_batch != b.micro_batch ||
        Checksum(a) != Checksum(b)) {
      std::printf(
          "resumed micro-batch %zu differs: step %lld/%lld, checksum %016llx "
          "vs %016llx\n",
          i, static_cast<long long>(a.step), static_cast<long long>(b.step),
          static_cast<unsigned long long>(Checksum(a)),
          static_cast<unsigned long long>(Checksum(b)));
      rc = 3;
    }
  }
  if (rc == 0) {
    std::printf("resumed from the state: %zu micro-batches identical\n", again.size());
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s CONFIG [MICRO_BATCHES]\n", argv[0]);
    return 2;
  }
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 4;
  if (n < 2) {
    std::fprintf(stderr, "MICRO_BATCHES must be >= 2\n");
    return 2;
  }
  braid::Result<int> rc = Run(argv[1], n);
  if (!rc.ok()) {
    std::fprintf(stderr, "error: %s\n", rc.status().ToString().c_str());
    return 1;
  }
  return *rc;
}
