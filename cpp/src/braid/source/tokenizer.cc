#include "braid/source/tokenizer.h"

#include <sentencepiece_processor.h>

namespace braid {

Tokenizer::Tokenizer(TokenizerConfig config)
    : config_(std::move(config)),
      sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}

Tokenizer::~Tokenizer() = default;

Result<std::shared_ptr<const Tokenizer>> Tokenizer::Make(const TokenizerConfig& config) {
  std::shared_ptr<Tokenizer> t(new Tokenizer(config));
  const auto st = t->sp_->Load(config.model);
  if (!st.ok()) {
    return ConfigError("tokenizer.model",
                       "cannot load SentencePiece model '" + config.model + "': " +
                           st.ToString());
  }
  t->bos_id_ = t->sp_->bos_id();
  t->eos_id_ = t->sp_->eos_id();
  return std::shared_ptr<const Tokenizer>(std::move(t));
}

int32_t Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::string Tokenizer::IdToPiece(int32_t id) const {
  return id >= 0 && id < vocab_size() ? sp_->IdToPiece(id) : std::string();
}

Status Tokenizer::Encode(std::string_view text, std::vector<int32_t>* out) const {
  std::vector<int> ids;
  const auto st = sp_->Encode(absl::string_view(text.data(), text.size()), &ids);
  if (!st.ok()) return Status::Invalid("SentencePiece: ", st.ToString());
  out->insert(out->end(), ids.begin(), ids.end());
  return Status::OK();
}

}  // namespace braid
