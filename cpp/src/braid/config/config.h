// The typed job configuration and its YAML parser.
//
// A Config is what a user writes (YAML or JSON, a file or a Python dict serialized to JSON),
// checked once: every unknown key, wrong type or out-of-range value is an Invalid status
// whose message starts with the key path ("sources[1].weight: must be >= 0"). The rest of
// Braid trusts a Config that came out of ParseConfig. See docs/config.md for every key.
//
// Thread-safe: a Config is an immutable value after parsing.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "braid/status.h"

namespace braid {

/// What to do with a document longer than the sequence.
enum class Oversize { kSplit, kTruncate, kSkip };
/// What to do with a bad sample (null, wrong length): fail the job or skip and count it.
enum class OnError { kFail, kSkip };
/// How sequences are assigned to DP ranks.
enum class BalanceAlgorithm { kKarmarkarKarp, kGreedy, kNone };

const char* ToString(Oversize v);
const char* ToString(OnError v);
const char* ToString(BalanceAlgorithm v);

/// A source weight as a function of the global step: piecewise linear between points,
/// constant before the first and after the last. A constant weight is one point.
struct WeightSchedule {
  // INVARIANT: non-empty, steps strictly increasing, weights >= 0.
  std::vector<std::pair<int64_t, double>> points{{0, 1.0}};

  double At(int64_t step) const;
};

// --- Transforms (docs/sources.md) ---
/// Chat or instruction data: prompt/response string columns, or one messages column
/// (list<struct<role: string, content: string>>). Empty: the source is not a chat source.
struct ChatColumns {
  std::string prompt_column;
  std::string response_column;
  std::string messages_column;
  bool enabled() const { return !messages_column.empty() || !prompt_column.empty(); }
};

/// The tokenizer of text and chat sources. `model` empty: none configured.
struct TokenizerConfig {
  std::string type = "sentencepiece";
  std::string model;  ///< absolute path after parsing
  bool bos = false;   ///< prepend the model's BOS id to each document
  bool eos = true;    ///< append the model's EOS id to each document
};
// --- end transforms ---

struct SourceConfig {
  std::string name;
  std::string path;           ///< as written: a file, a directory or a glob
  std::string tokens_column;  ///< list<int32|int64> column of token ids
  WeightSchedule weight;
  Oversize oversize = Oversize::kSplit;
  OnError on_error = OnError::kFail;
  int64_t shuffle_window_rows = 4096;  ///< rows shuffled together (>= 1; 1 = file order)

  // --- Transforms (docs/sources.md). Exactly one of tokens_column, text_column, chat. ---
  std::string text_column;  ///< string column, tokenized with Config::tokenizer
  ChatColumns chat;         ///< chat / instruction columns, tokenized with the tokenizer
  int64_t workers = 1;      ///< transform threads of this source's loader (>= 1)
};

struct Topology {
  int64_t dp = 1, tp = 1, pp = 1, cp = 1;
  int64_t world_size() const { return dp * tp * pp * cp; }
};

struct BatchConfig {
  int64_t global_tokens = 0;  ///< tokens per global step, over all DP ranks
  int64_t seq_len = 0;
  int64_t micro_batch_size = 1;  ///< sequences per micro-batch
  bool packing = true;
};

struct BalanceConfig {
  double attn = 1.0;    ///< cost coefficient of L^2 (causal attention)
  double linear = 0.0;  ///< cost coefficient of L (MLP, projections)
  BalanceAlgorithm algorithm = BalanceAlgorithm::kKarmarkarKarp;
};

struct RuntimeConfig {
  int64_t read_ahead_bytes = int64_t{64} << 20;  ///< payload bytes buffered per source
  int64_t prefetch_steps = 2;                    ///< step plans computed ahead
};

struct Config {
  uint64_t seed = 0;
  Topology topology;
  BatchConfig batch;
  BalanceConfig balance;
  std::vector<SourceConfig> sources;
  RuntimeConfig runtime;
  TokenizerConfig tokenizer;  ///< for text_column / chat sources
  std::string base_dir;  ///< relative source paths resolve against this folder

  /// Sequences in one global step (global_tokens / seq_len); independent of dp.
  int64_t sequences_per_step() const { return batch.global_tokens / batch.seq_len; }
  /// Micro-batches each DP rank receives per step.
  int64_t micro_batches_per_rank() const {
    return sequences_per_step() / (topology.dp * batch.micro_batch_size);
  }
  /// Hash of everything that determines the sample stream (seed, sources, sequence
  /// shape); weights and topology are excluded so a run may resume with new ones.
  std::string Fingerprint() const;
};

/// Parses YAML (or JSON) text. Relative paths resolve against `base_dir`.
/// Fails with Invalid naming the key path on any bad key or value.
Result<Config> ParseConfig(const std::string& text, const std::string& base_dir);

/// Reads and parses a config file; relative paths resolve against its folder.
Result<Config> LoadConfigFile(const std::string& path);

/// Overrides topology.dp (the CLI's --dp) and re-checks the batch shape.
Status SetDataParallel(Config* config, int64_t dp);

/// Checks the cross-field rules (batch shape divisible by topology, weights not all 0).
Status ValidateConfig(const Config& config);

}  // namespace braid
