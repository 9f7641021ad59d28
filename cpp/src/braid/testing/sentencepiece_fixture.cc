#include "braid/testing/sentencepiece_fixture.h"

#include <filesystem>
#include <fstream>
#include <random>

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/writer.h>
#include <sentencepiece_trainer.h>

namespace braid::testing {

std::vector<std::string> RandomSentences(int64_t count, uint64_t seed, int64_t min_words,
                                         int64_t max_words) {
  static const char* kWords[] = {
      "the",   "data",    "loader", "reads",  "parquet", "files", "and",    "mixes",
      "many",  "sources", "into",   "steps",  "of",      "tokens", "for",   "training",
      "large", "language", "models", "with",  "balanced", "ranks", "a",     "quick",
      "brown", "fox",     "jumps",  "over",   "lazy",    "dog",   "shuffle", "window",
      "epoch", "seeded",  "order",  "exactly", "once",   "per",   "worker", "thread"};
  constexpr int64_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> len(min_words, max_words);
  std::uniform_int_distribution<int64_t> word(0, kNumWords - 1);
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    std::string s;
    const int64_t n = len(rng);
    for (int64_t w = 0; w < n; ++w) {
      if (w) s += ' ';
      s += kWords[word(rng)];
    }
    s += '.';
    out.push_back(std::move(s));
  }
  return out;
}

Status TrainTinySentencePiece(const std::vector<std::string>& sentences,
                              const std::string& model_prefix, int32_t vocab_size) {
  const std::string text_path = model_prefix + ".txt";
  {
    std::ofstream out(text_path);
    for (const auto& s : sentences) out << s << '\n';
    if (!out) return Status::IOError("cannot write ", text_path);
  }
  const std::string args = "--input=" + text_path + " --model_prefix=" + model_prefix +
                           " --vocab_size=" + std::to_string(vocab_size) +
                           " --model_type=unigram --character_coverage=1.0"
                           " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1"
                           " --hard_vocab_limit=false"
                           " --num_threads=1 --minloglevel=1";
  const auto st = sentencepiece::SentencePieceTrainer::Train(args);
  if (!st.ok()) return Status::Invalid("SentencePiece training: ", st.ToString());
  return Status::OK();
}

Status WriteTextFile(const std::string& path, const std::string& column,
                     const std::vector<std::optional<std::string>>& rows,
                     int64_t row_group_rows) {
  arrow::StringBuilder b;
  for (const auto& r : rows) {
    ARROW_RETURN_NOT_OK(r ? b.Append(*r) : b.AppendNull());
  }
  ARROW_ASSIGN_OR_RAISE(auto array, b.Finish());
  auto table =
      arrow::Table::Make(arrow::schema({arrow::field(column, arrow::utf8())}), {array});
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  ARROW_ASSIGN_OR_RAISE(auto out, arrow::io::FileOutputStream::Open(path));
  ARROW_RETURN_NOT_OK(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out,
                                                 row_group_rows));
  return out->Close();
}

}  // namespace braid::testing
