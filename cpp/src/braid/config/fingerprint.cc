// Config::Fingerprint (config.h): the hash of everything that determines the sample
// stream, which a saved state must match to resume (plan/step_plan.h).
//
// Thread-safe: reads an immutable Config.
#include <cstdio>
#include <sstream>

#include "braid/config/config.h"
#include "braid/util/hash_internal.h"
#include "braid/util/rng_internal.h"

namespace braid {

std::string Config::Fingerprint() const {
  std::ostringstream os;
  os << seed << '|' << batch.global_tokens << '|' << batch.seq_len << '|'
     << batch.micro_batch_size;
  // Padding changes every piece (and the state's units); 1 keeps the old fingerprint.
  if (batch.pad_to_multiple_of != 1) os << "|pad=" << batch.pad_to_multiple_of;
  for (const auto& s : sources) {
    os << '|' << s.name << ':' << s.path << ':' << s.tokens_column << ':'
       << ToString(s.oversize) << ':' << s.shuffle_window_rows;
    // The byte bound changes the order (windows, blocks); 0 keeps the rows-only order
    // and its fingerprint, so states saved before the bound existed resume under it.
    if (s.shuffle_window_bytes != 0) os << ":wb=" << s.shuffle_window_bytes;
    // Transforms change the tokens; worker count does not change the stream, nor does
    // length_column (a length that disagrees with its token list is an error).
    if (!s.text_column.empty() || s.chat.enabled()) {
      os << ":text=" << s.text_column << ":chat=" << s.chat.prompt_column << ','
         << s.chat.response_column << ',' << s.chat.messages_column;
    }
    if (s.user_transform.enabled()) {  // user transform: the function's name and input
      os << ":transform=" << s.user_transform.python;
      for (const auto& c : s.user_transform.columns) os << ',' << c;
    }
    if (!s.image_column.empty()) {  // images
      os << ":image=" << s.image_column << ',' << s.image_patch_size << ','
         << s.image_max_pixels << ',' << s.image_token_id;
    }
  }
  // A tokenizer's identity: SentencePiece as it always was, Hugging Face with its options.
  auto tok = [&os](const TokenizerConfig& t) {
    if (t.huggingface()) {
      os << "hf:" << t.model << ':' << t.add_special_tokens << ':' << t.bos_token << ':'
         << t.eos_token << (t.chat_template ? "" : ":plain");
    } else {
      os << t.model << ':' << t.bos << t.eos;
    }
  };
  if (!tokenizer.model.empty()) {
    os << "|tok:";
    tok(tokenizer);
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].tokenizer.model.empty()) continue;
    os << "|tok" << i << ':';
    tok(sources[i].tokenizer);
  }
  const std::string text = os.str();
  const uint64_t h = internal::Fnv1a(text);  // then mixed
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(internal::Mix64(h)));
  return buf;
}

}  // namespace braid
