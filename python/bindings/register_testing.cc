// Entry points for tests, the demo and the benchmarks: data generators (the demo
// dataset, a tiny SentencePiece model, JPEG bytes), one source's samples in full, the
// ids of a text under a SentencePiece model, and the pool threads' kept thread states.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "braid/config/config.h"
#include "braid/source/sharded_source.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/sentencepiece_fixture.h"
#include "braid/transform/image.h"
#include "braid/transform/tokenizer.h"
#include "status_caster.h"
#include "thread_states.h"

namespace nb = nanobind;

namespace braid::python {

void RegisterTesting(nb::module_& m) {
  m.def("make_demo_dataset",
        [](const std::string& dir, uint64_t seed, int64_t seq_len, int64_t dp,
           int64_t micro_batches, double scale) {
          Result<testing::DemoDataset> result;
          {
            nb::gil_scoped_release release;
            result = testing::MakeDemoDataset(dir, seed, seq_len, dp, micro_batches, scale);
          }
          auto demo = ValueOrThrow(std::move(result));
          nb::dict d;
          d["config_path"] = demo.config_path;
          d["source_names"] = demo.source_names;
          d["docs"] = demo.docs;
          d["tokens"] = demo.tokens;
          return d;
        },
        nb::arg("dir"), nb::arg("seed") = 1234, nb::arg("seq_len") = 4096,
        nb::arg("dp") = 8, nb::arg("micro_batches") = 4, nb::arg("scale") = 1.0,
        "Writes the three-source demo dataset and its config under dir.");

  m.def(
      "source_samples",
      [](const Config& config, int32_t source_index, int64_t samples) {
        if (source_index < 0 || size_t(source_index) >= config.sources.size()) {
          throw nb::index_error("source_index out of range");
        }
        std::vector<Sample> got;
        Status st;
        {
          GilRelease release;
          auto loader = ShardedSource::Make(config, source_index, StreamPos{}, {},
                                            config.sources[size_t(source_index)].loaders);
          st = loader.status();
          for (int64_t n = 0; st.ok() && n < samples; ++n) {
            auto s = (*loader)->Next();
            if (!s.ok()) {
              st = s.status();
              break;
            }
            if (s->payload) {
              auto payload = s->payload.Get();
              if (!payload.ok()) {
                st = payload.status();
                break;
              }
            }
            got.push_back(std::move(*s));
          }
        }
        ThrowIfError(st);
        nb::list out;
        for (const Sample& s : got) {
          nb::dict d;
          d["file"] = s.meta.file;
          d["row"] = s.meta.row;
          d["epoch"] = s.meta.epoch;
          d["skip"] = static_cast<int>(s.meta.skip);
          d["tokens"] = s.meta.tokens;
          if (s.payload) {
            const Payload& p = *s.payload.operator->();  // finished above
            d["ids"] = std::vector<int32_t>(p.tokens.begin(), p.tokens.end());
            d["loss_mask"] = std::vector<int32_t>(p.loss_mask.begin(), p.loss_mask.end());
          }
          out.append(d);
        }
        return out;
      },
      nb::arg("config"), nb::arg("source_index"), nb::arg("samples"),
      "The first `samples` samples of one source's stream, each a dict (file, row, epoch, "
      "skip, tokens, and with a payload its ids and loss_mask), for tests.");

  m.def(
      "train_tiny_sentencepiece",
      [](const std::vector<std::string>& sentences, const std::string& model_prefix,
         int32_t vocab_size) {
        Status st;
        {
          GilRelease release;
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
          ThrowStatus(ConfigError("rgb", "must hold width * height * 3 bytes"));
        }
        std::string jpeg = ValueOrThrow(
            EncodeJpeg(static_cast<const uint8_t*>(rgb.data()), width, height));
        return nb::bytes(jpeg.data(), jpeg.size());
      },
      nb::arg("rgb"), nb::arg("width"), nb::arg("height"),
      "JPEG bytes (quality 95, 4:4:4) of packed RGB8 pixels, for image tests.");

  m.def("_kept_thread_states", &KeptThreadStates,
        "How many pool threads alive now keep a Python thread state (for tests).");
}

}  // namespace braid::python
