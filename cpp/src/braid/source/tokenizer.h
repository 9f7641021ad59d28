// The SentencePiece tokenizer of text and chat sources.
//
// Loads the model named by the root `tokenizer` key once per source loader. Encode() is
// const and thread-safe (SentencePieceProcessor::Encode is), so a loader's transform
// workers share one Tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "braid/config/config.h"
#include "braid/status.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace braid {

class Tokenizer {
 public:
  /// Loads `config.model`. Fails with a config error naming tokenizer.model if the file is
  /// missing or not a SentencePiece model.
  static Result<std::shared_ptr<const Tokenizer>> Make(const TokenizerConfig& config);
  ~Tokenizer();

  /// Appends the ids of `text` to `out` (no BOS/EOS). Thread-safe.
  Status Encode(std::string_view text, std::vector<int32_t>* out) const;

  /// The model's BOS / EOS ids (-1 if the model has none).
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  /// Whether documents get a leading BOS / trailing EOS (config, and the model has one).
  bool add_bos() const { return config_.bos && bos_id_ >= 0; }
  bool add_eos() const { return config_.eos && eos_id_ >= 0; }
  int32_t vocab_size() const;
  /// The piece of `id` ("" if out of range).
  std::string IdToPiece(int32_t id) const;

 private:
  explicit Tokenizer(TokenizerConfig config);

  const TokenizerConfig config_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
};

}  // namespace braid
