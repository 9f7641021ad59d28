#include "braid/transform/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <tuple>

#include <sentencepiece_processor.h>

namespace braid {
namespace {

// SentencePiece: one text per call (Encode is thread-safe); BOS / EOS per the config.
class SentencePieceTokenizer : public Tokenizer {
 public:
  static Result<std::shared_ptr<const Tokenizer>> Make(const TokenizerConfig& config) {
    std::shared_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer());
    const auto st = t->sp_.Load(config.model);
    if (!st.ok()) {
      return ConfigError(config.key + ".model", "cannot load SentencePiece model '" +
                                                    config.model + "': " + st.ToString());
    }
    if (config.bos && t->sp_.bos_id() >= 0) t->prefix_.push_back(t->sp_.bos_id());
    if (config.eos && t->sp_.eos_id() >= 0) t->suffix_.push_back(t->sp_.eos_id());
    return std::shared_ptr<const Tokenizer>(std::move(t));
  }

  Status EncodeBatch(const std::vector<std::string_view>& texts, bool document,
                     std::vector<std::vector<int32_t>>* out) const override {
    out->resize(texts.size());
    std::vector<int> ids;
    for (size_t k = 0; k < texts.size(); ++k) {
      auto& o = (*out)[k];
      o.clear();
      if (document) o = prefix_;
      const auto st =
          sp_.Encode(absl::string_view(texts[k].data(), texts[k].size()), &ids);
      if (!st.ok()) return Status::Invalid("SentencePiece: ", st.ToString());
      o.insert(o.end(), ids.begin(), ids.end());
      if (document) o.insert(o.end(), suffix_.begin(), suffix_.end());
    }
    return Status::OK();
  }

 private:
  SentencePieceTokenizer() = default;
  sentencepiece::SentencePieceProcessor sp_;
};

// Hugging Face tokenizers (docs/sources.md): the installed encoder factory, and the
// Tokenizer over an HfEncoder.

std::mutex& FactoryMutex() {
  static std::mutex mu;
  return mu;
}

HfEncoderFactory& Factory() {
  static HfEncoderFactory factory;  // GUARDED_BY(FactoryMutex())
  return factory;
}

// Rows per encode_batch call: enough to amortize the call and the GIL, small enough to
// spread a loader batch (256 rows per worker) over its workers.
constexpr int64_t kHfBatchRows = 64;

class HfTokenizer : public Tokenizer {
 public:
  HfTokenizer(const TokenizerConfig& config, std::shared_ptr<const HfEncoder> encoder)
      : add_special_tokens_(config.add_special_tokens), encoder_(std::move(encoder)) {}

  // Finds the framing (the header's MakeHfTokenizer).
  Status Init(const TokenizerConfig& config) {
    for (auto [name, token, id] :
         {std::tuple{"bos_token", &config.bos_token, &bos_},
          std::tuple{"eos_token", &config.eos_token, &eos_}}) {
      if (token->empty()) continue;
      *id = encoder_->TokenId(*token);
      if (*id < 0) {
        return ConfigError(config.key + "." + name,
                           "'" + *token + "' is not a token of " + config.model);
      }
    }
    if (add_special_tokens_) {
      // What the post-processor puts around a text: encode a probe both ways and find the
      // plain ids inside the framed ones.
      std::vector<std::vector<int32_t>> plain, framed;
      const std::vector<std::string_view> probe = {"a"};
      ARROW_RETURN_NOT_OK(encoder_->EncodeBatch(probe, false, &plain));
      ARROW_RETURN_NOT_OK(encoder_->EncodeBatch(probe, true, &framed));
      const auto& p = plain.at(0);
      const auto& f = framed.at(0);
      const auto at = std::search(f.begin(), f.end(), p.begin(), p.end());
      if (p.empty() || at == f.end()) {
        return ConfigError(config.key + ".file",
                           "the post-processor of " + config.model +
                               " does not keep a text's ids together, so chat turns and "
                               "captions cannot be framed; set add_special_tokens: false "
                               "(and bos_token / eos_token)");
      }
      prefix_.assign(f.begin(), at);
      suffix_.assign(at + std::ptrdiff_t(p.size()), f.end());
    }
    if (bos_ >= 0) prefix_.insert(prefix_.begin(), bos_);
    if (eos_ >= 0) suffix_.push_back(eos_);
    return Status::OK();
  }

  Status EncodeBatch(const std::vector<std::string_view>& texts, bool document,
                     std::vector<std::vector<int32_t>>* out) const override {
    ARROW_RETURN_NOT_OK(
        encoder_->EncodeBatch(texts, document && add_special_tokens_, out));
    if (out->size() != texts.size()) {
      return Status::Invalid("the tokenizer returned ", out->size(), " encodings for ",
                             texts.size(), " texts");
    }
    if (document && (bos_ >= 0 || eos_ >= 0)) {
      for (auto& ids : *out) {
        if (bos_ >= 0) ids.insert(ids.begin(), bos_);
        if (eos_ >= 0) ids.push_back(eos_);
      }
    }
    return Status::OK();
  }

  int64_t batch_rows() const override { return kHfBatchRows; }
  void Cancel() const override { encoder_->Cancel(); }

  bool has_chat_template() const override { return encoder_->has_chat_template(); }

  Status ApplyChatTemplate(const std::vector<std::vector<ChatMessage>>& chats,
                           std::vector<std::vector<int32_t>>* ids,
                           std::vector<std::vector<uint8_t>>* loss_masks,
                           std::vector<std::string>* refused) const override {
    std::vector<std::vector<int64_t>> starts;
    std::vector<std::vector<std::pair<int64_t, int64_t>>> spans;
    ARROW_RETURN_NOT_OK(encoder_->EncodeChats(chats, ids, &starts, &spans, refused));
    if (ids->size() != chats.size() || starts.size() != chats.size() ||
        spans.size() != chats.size() || refused->size() != chats.size()) {
      return Status::Invalid("the chat template returned ", ids->size(),
                             " encodings for ", chats.size(), " chats");
    }
    loss_masks->resize(chats.size());
    for (size_t k = 0; k < chats.size(); ++k) {
      if (starts[k].size() != (*ids)[k].size()) {
        return Status::Invalid("the tokenizer returned ", starts[k].size(),
                               " offsets for ", (*ids)[k].size(), " tokens");
      }
      // A token is trained when it starts inside what an assistant message made.
      auto& mask = (*loss_masks)[k];
      mask.assign((*ids)[k].size(), 0);
      for (size_t t = 0; t < mask.size(); ++t) {
        for (const auto& [begin, end] : spans[k]) {
          if (starts[k][t] >= begin && starts[k][t] < end) {
            mask[t] = 1;
            break;
          }
        }
      }
    }
    return Status::OK();
  }

 private:
  const bool add_special_tokens_;
  const std::shared_ptr<const HfEncoder> encoder_;
  int32_t bos_ = -1;
  int32_t eos_ = -1;
};

}  // namespace

Status Tokenizer::ApplyChatTemplate(const std::vector<std::vector<ChatMessage>>&,
                                    std::vector<std::vector<int32_t>>*,
                                    std::vector<std::vector<uint8_t>>*,
                                    std::vector<std::string>*) const {
  return Status::NotImplemented("this tokenizer has no chat template");
}

Status HfEncoder::EncodeChats(const std::vector<std::vector<ChatMessage>>&,
                              std::vector<std::vector<int32_t>>*,
                              std::vector<std::vector<int64_t>>*,
                              std::vector<std::vector<std::pair<int64_t, int64_t>>>*,
                              std::vector<std::string>*) const {
  return Status::NotImplemented("this tokenizer has no chat template");
}

Status Tokenizer::Encode(std::string_view text, std::vector<int32_t>* out) const {
  std::vector<std::vector<int32_t>> ids;
  ARROW_RETURN_NOT_OK(EncodeBatch({text}, /*document=*/false, &ids));
  out->insert(out->end(), ids.at(0).begin(), ids.at(0).end());
  return Status::OK();
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::Make(const TokenizerConfig& config) {
  if (!config.huggingface()) return SentencePieceTokenizer::Make(config);
  HfEncoderFactory factory;
  {
    std::lock_guard<std::mutex> lock(FactoryMutex());
    factory = Factory();
  }
  if (!factory) {
    return ConfigError(config.key + ".type",
                       "huggingface tokenizers need the Python extension (import braid), "
                       "or an encoder installed with SetHfEncoderFactory from C++");
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(config.model, ec)) {
    return ConfigError(config.key + ".file", "no such file: " + config.model);
  }
  // The factory runs outside the lock: it imports a module and reads a file.
  ARROW_ASSIGN_OR_RAISE(auto encoder, factory(config));
  return MakeHfTokenizer(config, std::move(encoder));
}

void SetHfEncoderFactory(HfEncoderFactory factory) {
  std::lock_guard<std::mutex> lock(FactoryMutex());
  Factory() = std::move(factory);
}

Result<std::shared_ptr<const Tokenizer>> MakeHfTokenizer(
    const TokenizerConfig& config, std::shared_ptr<const HfEncoder> encoder) {
  if (!encoder) return ConfigError(config.key + ".file", "no tokenizer was made");
  auto t = std::make_shared<HfTokenizer>(config, std::move(encoder));
  const Status st = t->Init(config);
  if (!st.ok()) {
    if (GetErrorDetail(st) != nullptr) return st;
    return ConfigError(config.key + ".file", "cannot use " + config.model + ": " +
                                                 st.message());
  }
  return std::shared_ptr<const Tokenizer>(std::move(t));
}

}  // namespace braid
