// Source loaders on their own, for benchmarks (and tests): pull samples of one source
// through its loader(s), and the raw SentencePiece encoding that benchmarks compare a
// text source's loader against. The Python side of user transforms and Hugging Face
// tokenizers: register_user_transform.cc, register_hf_tokenizer.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "braid/config/config.h"
#include "braid/source/sharded_source.h"
#include "braid/source/source_loader.h"
#include "braid/transform/tokenizer.h"
#include "status_caster.h"
#include "thread_states.h"

namespace nb = nanobind;

namespace braid::python {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

void RegisterSource(nb::module_& m) {
  m.def(
      "read_source",
      [](const Config& config, int32_t source_index, int64_t samples, bool payloads) {
        if (source_index < 0 || size_t(source_index) >= config.sources.size()) {
          throw nb::index_error("source_index out of range");
        }
        int64_t n = 0, tokens = 0, payload_tokens = 0, skipped = 0, masked = 0;
        double seconds = 0;
        Status st;
        {
          GilRelease release;
          const auto start = std::chrono::steady_clock::now();
          SourceLoader::Options options;
          options.read_payloads = payloads;
          options.read_ahead_bytes = config.runtime.read_ahead_bytes;
          auto loader = ShardedSource::Make(config, source_index, StreamPos{}, options,
                                            config.sources[size_t(source_index)].loaders);
          st = loader.status();
          for (; st.ok() && n < samples; ++n) {
            auto s = (*loader)->Next();
            if (!s.ok()) {
              st = s.status();
              break;
            }
            tokens += s->meta.tokens;
            if (s->meta.skip != SkipReason::kNone) ++skipped;
            if (s->payload) {
              // Waits for a payload still being made (metadata first); its error stops.
              auto payload = s->payload.Get();
              if (!payload.ok()) {
                st = payload.status();
                break;
              }
              payload_tokens += static_cast<int64_t>((*payload)->tokens.size());
              for (uint8_t b : (*payload)->loss_mask) masked += b;
            }
          }
          seconds = Seconds(start);
        }
        ThrowIfError(st);
        nb::dict d;
        d["samples"] = n;
        d["tokens"] = tokens;
        d["payload_tokens"] = payload_tokens;
        d["loss_mask_ones"] = masked;
        d["skipped"] = skipped;
        d["seconds"] = seconds;
        return d;
      },
      nb::arg("config"), nb::arg("source_index"), nb::arg("samples"),
      nb::arg("payloads") = true,
      "Pulls `samples` samples of one source through its loader(s) (sources[].loaders; "
      "from the start of its order); returns counts and the seconds taken, loader start "
      "included.");

  m.def(
      "sentencepiece_encode",
      [](const std::string& model, const std::vector<std::string>& texts, int64_t threads) {
        std::vector<std::vector<int32_t>> ids(texts.size());
        double seconds = 0;
        Status st;
        {
          GilRelease release;
          TokenizerConfig tc;
          tc.model = model;
          auto tok = Tokenizer::Make(tc);
          st = tok.status();
          if (st.ok()) {
            const auto start = std::chrono::steady_clock::now();
            std::atomic<size_t> next{0};
            auto work = [&] {
              for (size_t i; (i = next.fetch_add(1)) < texts.size();) {
                (void)(*tok)->Encode(texts[i], &ids[i]);
              }
            };
            std::vector<std::thread> pool;
            for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
            work();
            for (auto& t : pool) t.join();
            seconds = Seconds(start);
          }
        }
        ThrowIfError(st);
        int64_t tokens = 0;
        for (const auto& v : ids) tokens += static_cast<int64_t>(v.size());
        nb::dict d;
        d["tokens"] = tokens;
        d["seconds"] = seconds;
        return d;
      },
      nb::arg("model"), nb::arg("texts"), nb::arg("threads") = 1,
      "Raw SentencePiece encoding of texts on `threads` threads (no BOS/EOS): the "
      "baseline of benchmarks/source_read.py. Returns total tokens and seconds.");
}

}  // namespace braid::python
