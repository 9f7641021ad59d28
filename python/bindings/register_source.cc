// Source loaders on their own: pull samples (benchmarks, tests), and SentencePiece
// helpers (train a tiny model, raw encoding as a benchmark baseline).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "braid/config/config.h"
#include "braid/source/image.h"
#include "braid/source/source_loader.h"
#include "braid/source/tokenizer.h"
#include "braid/testing/sentencepiece_fixture.h"
#include "status_caster.h"

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
          nb::gil_scoped_release release;
          const auto start = std::chrono::steady_clock::now();
          SourceLoader::Options options;
          options.read_payloads = payloads;
          options.read_ahead_bytes = config.runtime.read_ahead_bytes;
          auto loader = SourceLoader::Make(config, source_index, StreamPos{}, options);
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
              payload_tokens += static_cast<int64_t>(s->payload->tokens.size());
              for (uint8_t b : s->payload->loss_mask) masked += b;
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
      "Pulls `samples` samples of one source through its loader (from the start of its "
      "order); returns counts and the seconds taken, loader start included.");

  m.def(
      "train_tiny_sentencepiece",
      [](const std::vector<std::string>& sentences, const std::string& model_prefix,
         int32_t vocab_size) {
        Status st;
        {
          nb::gil_scoped_release release;
          st = testing::TrainTinySentencePiece(sentences, model_prefix, vocab_size);
        }
        ThrowIfError(st);
        return model_prefix + ".model";
      },
      nb::arg("sentences"), nb::arg("model_prefix"), nb::arg("vocab_size") = 200,
      "Trains a unigram SentencePiece model on the sentences (unk 0, bos 1, eos 2) and "
      "returns the model path. For tests and benchmarks.");

  m.def(
      "sentencepiece_tokenize",
      [](const std::string& model, const std::string& text) {
        TokenizerConfig tc;
        tc.model = model;
        auto tok = ValueOrThrow(Tokenizer::Make(tc));
        std::vector<int32_t> ids;
        ThrowIfError(tok->Encode(text, &ids));
        return ids;
      },
      nb::arg("model"), nb::arg("text"),
      "The ids of text under a SentencePiece model (no BOS/EOS), for tests.");

  m.def(
      "encode_test_jpeg",
      [](nb::bytes rgb, int width, int height) {
        if (rgb.size() != size_t(width) * size_t(height) * 3) {
          ThrowIfError(Status::Invalid("rgb must hold width * height * 3 bytes"));
        }
        std::string jpeg = ValueOrThrow(
            EncodeJpeg(static_cast<const uint8_t*>(rgb.data()), width, height));
        return nb::bytes(jpeg.data(), jpeg.size());
      },
      nb::arg("rgb"), nb::arg("width"), nb::arg("height"),
      "JPEG bytes (quality 95, 4:4:4) of packed RGB8 pixels, for image tests.");

  m.def(
      "sentencepiece_encode",
      [](const std::string& model, const std::vector<std::string>& texts, int64_t threads) {
        std::vector<std::vector<int32_t>> ids(texts.size());
        double seconds = 0;
        Status st;
        {
          nb::gil_scoped_release release;
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
