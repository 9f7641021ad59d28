// Tiny SentencePiece models and text Parquet files for tests and benchmarks.
//
// Thread-compatible: TrainTinySentencePiece runs SentencePiece's trainer, which is not
// meant to run twice at once in one process.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "braid/status.h"

namespace braid::testing {

/// Seeded English-like sentences over a small fixed vocabulary of words.
std::vector<std::string> RandomSentences(int64_t count, uint64_t seed,
                                         int64_t min_words = 3, int64_t max_words = 30);

/// Trains a unigram SentencePiece model of `vocab_size` pieces on `sentences` (written to
/// `model_prefix`.txt) and writes `model_prefix`.model. Ids: unk 0, bos 1, eos 2.
Status TrainTinySentencePiece(const std::vector<std::string>& sentences,
                              const std::string& model_prefix, int32_t vocab_size = 200);

/// Writes one string column `column` (nullopt rows are null).
Status WriteTextFile(const std::string& path, const std::string& column,
                     const std::vector<std::optional<std::string>>& rows,
                     int64_t row_group_rows = 64);

}  // namespace braid::testing
