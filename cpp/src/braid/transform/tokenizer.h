// The tokenizers of text and chat sources.
//
// Tokenizer is the interface the transforms (transform/transform.h) call. Two kinds, chosen
// by TokenizerConfig::type (docs/config.md):
//   sentencepiece  a SentencePiece .model, in the core; encodes one text per call, so the
//                  loader spreads rows over its workers one by one (batch_rows() 1)
//   huggingface    a Hugging Face tokenizer.json through the `tokenizers` Python package.
//                  The core links no Python: like user transforms (user_transform.h) the
//                  Python extension installs an HfEncoderFactory (the library's encode,
//                  below), and the core frames its ids; without one (a C++ program) the
//                  config is refused, naming the key. It encodes a batch of texts per
//                  call (batch_rows() > 1).
//
// A document's ids are prefix() + ids(text) + suffix() for SentencePiece (BOS / EOS per
// the config); for Hugging Face what the tokenizer's post-processor makes of the text
// (add_special_tokens), plus bos_token / eos_token. Chat turns and captions are encoded
// without specials and framed by prefix() / suffix() (docs/sources.md).
//
// Thread-safety: Make, SetHfEncoderFactory and every const method are thread-safe; a
// loader's workers share one Tokenizer and call EncodeBatch concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "braid/config/config.h"
#include "braid/status.h"

namespace braid {

/// One message of a chat.
struct ChatMessage {
  std::string_view role;
  std::string_view content;
};

class Tokenizer {
 public:
  /// The tokenizer `config` names. Fails with a config error naming its key path
  /// (config.key + ".model" / ".file" / ".type") if the file is missing or invalid, or
  /// if a Hugging Face tokenizer is asked for and no factory is installed.
  static Result<std::shared_ptr<const Tokenizer>> Make(const TokenizerConfig& config);
  virtual ~Tokenizer() = default;

  /// Encodes texts[k] into (*out)[k] (replacing it), one call for the batch. `document`:
  /// with the document specials (see the header comment); false: the plain ids (chat
  /// turns, captions). An error names no row (the caller does). Thread-safe; after
  /// Cancel() it may return Cancelled.
  virtual Status EncodeBatch(const std::vector<std::string_view>& texts, bool document,
                             std::vector<std::vector<int32_t>>* out) const = 0;

  /// Appends the plain ids of `text` to `out`. Thread-safe.
  Status Encode(std::string_view text, std::vector<int32_t>* out) const;

  /// The ids a document starts / ends with around its text (chat and caption framing);
  /// empty when none.
  const std::vector<int32_t>& prefix() const { return prefix_; }
  const std::vector<int32_t>& suffix() const { return suffix_; }

  /// Rows per EncodeBatch call the loader should hand over (1: row by row).
  virtual int64_t batch_rows() const { return 1; }

  /// Whether chats use the tokenizer's own chat template (ApplyChatTemplate) instead of
  /// Braid's plain one: a Hugging Face tokenizer whose tokenizer_config.json has one,
  /// unless the config says `chat_template: plain`.
  virtual bool has_chat_template() const { return false; }

  /// Each chat rendered by the tokenizer's chat template and encoded without special
  /// tokens (as `apply_chat_template(..., tokenize=True)`): (*ids)[k], and
  /// (*loss_masks)[k] with 1 on the tokens the assistant messages made (their content and
  /// end-of-turn markup; not the generation prompt before them). (*refused)[k] is empty,
  /// or why the template refused chat k (its `raise_exception`, or a chat it cannot
  /// mask): bad data, like a null. One call for the batch; an error names no row.
  /// Thread-safe.
  virtual Status ApplyChatTemplate(const std::vector<std::vector<ChatMessage>>& chats,
                                   std::vector<std::vector<int32_t>>* ids,
                                   std::vector<std::vector<uint8_t>>* loss_masks,
                                   std::vector<std::string>* refused) const;

  /// The loader is stopping (Transform::Cancel): calls may return Cancelled early, and a
  /// thread that holds a lock EncodeBatch waits for (the GIL) is let go.
  virtual void Cancel() const {}

 protected:
  std::vector<int32_t> prefix_;
  std::vector<int32_t> suffix_;
};

/// What the Python extension provides for a tokenizer.json: the library's own encoding.
/// Thread-safe: EncodeBatch runs on several worker threads at once.
class HfEncoder {
 public:
  virtual ~HfEncoder() = default;
  /// (*out)[k] = the ids of texts[k] (`encode_batch(texts, add_special_tokens)`). A
  /// failure is a non-OK status with the library's message.
  virtual Status EncodeBatch(const std::vector<std::string_view>& texts,
                             bool add_special_tokens,
                             std::vector<std::vector<int32_t>>* out) const = 0;
  /// The id of the token whose content is `token` (`token_to_id`), or -1.
  virtual int32_t TokenId(const std::string& token) const = 0;
  /// Whether the tokenizer ships a chat template (and the config wants it).
  virtual bool has_chat_template() const { return false; }
  /// Each chat rendered by the chat template and encoded without special tokens:
  /// (*ids)[k], the start of each token in the rendered text (*starts)[k], and the
  /// [begin, end) ranges of that text the assistant messages made (*spans)[k]; starts
  /// and ranges count the text's code points; (*refused)[k] is empty or why the
  /// template refused chat k. A failure is a non-OK status with the library's message.
  virtual Status EncodeChats(const std::vector<std::vector<ChatMessage>>& chats,
                             std::vector<std::vector<int32_t>>* ids,
                             std::vector<std::vector<int64_t>>* starts,
                             std::vector<std::vector<std::pair<int64_t, int64_t>>>* spans,
                             std::vector<std::string>* refused) const;
  /// As Tokenizer::Cancel.
  virtual void Cancel() const {}
};

/// Loads config.model (a tokenizer.json). Errors are config errors naming config.key.
using HfEncoderFactory =
    std::function<Result<std::shared_ptr<const HfEncoder>>(const TokenizerConfig& config)>;

/// Installs the process-wide factory, replacing any previous one (nullptr removes it).
void SetHfEncoderFactory(HfEncoderFactory factory);

/// The Tokenizer over `encoder` for `config` (type huggingface): documents are
/// encode(text, add_special_tokens) with bos_token / eos_token around; prefix() / suffix()
/// are what the post-processor puts around a text (found by encoding a probe with and
/// without specials) plus bos_token / eos_token. Fails naming config.key when a token is
/// not in the vocabulary or the post-processor splits a text's ids.
Result<std::shared_ptr<const Tokenizer>> MakeHfTokenizer(
    const TokenizerConfig& config, std::shared_ptr<const HfEncoder> encoder);

}  // namespace braid
