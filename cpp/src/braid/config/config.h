// The typed job configuration and its YAML parser.
//
// A Config is what a user writes (YAML or JSON, a file or a Python dict serialized to JSON),
// checked once: every unknown key, wrong type or out-of-range value is an Invalid status
// whose message starts with the key path ("sources[1].weight: must be >= 0"). The rest of
// Braid trusts a Config that came out of ParseConfig. See docs/config.md for every key.
//
// Thread-safe: a Config is an immutable value after parsing.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "braid/config.h"
#include "braid/status.h"

namespace braid {

/// What to do with a document longer than the sequence.
enum class Oversize { kSplit, kTruncate, kSkip };
/// What to do with a bad sample (null, wrong length): fail the job or skip and count it.
enum class OnError { kFail, kSkip };
/// How sequences are assigned to DP ranks.
enum class BalanceAlgorithm { kKarmarkarKarp, kGreedy, kNone };
/// The layout of a source's files (`sources[].format`, docs/sources.md "Formats"):
/// kAuto detects it from the names (io/formats.h).
enum class SourceFormat { kAuto, kParquet, kMegatron, kJsonl, kHfArrow, kWebDataset };

const char* ToString(Oversize v);
const char* ToString(SourceFormat v);
const char* ToString(OnError v);
const char* ToString(BalanceAlgorithm v);

// WeightSchedule (a weight as a function of the step) is public: braid/config.h.

/// Chat or instruction data: prompt/response string columns, or one messages column
/// (list<struct<role: string, content: string>>). Empty: the source is not a chat source.
struct ChatColumns {
  std::string prompt_column;
  std::string response_column;
  std::string messages_column;
  bool enabled() const { return !messages_column.empty() || !prompt_column.empty(); }
};

/// The tokenizer of text and chat sources (root `tokenizer`, or `sources[].tokenizer`).
/// `model` empty: none configured.
struct TokenizerConfig {
  /// "sentencepiece" (in the core) or "huggingface" (a tokenizer.json, through the
  /// `tokenizers` Python package: transform/tokenizer.h, SetHfTokenizerFactory).
  std::string type = "sentencepiece";
  std::string model;  ///< absolute path after parsing (`model`, or `file` for huggingface)
  std::string key = "tokenizer";  ///< its config key path, for errors
  // sentencepiece:
  bool bos = false;   ///< prepend the model's BOS id to each document
  bool eos = true;    ///< append the model's EOS id to each document
  // huggingface:
  /// Encode with the tokenizer's own post-processor (its BOS / EOS / templates).
  bool add_special_tokens = true;
  /// Tokens (by content, e.g. "<|end_of_text|>") put before / after each document on top
  /// of what the post-processor adds; "" none.
  std::string bos_token;
  std::string eos_token;
  /// `chat_template`: true (`auto`, the default) renders chats with the tokenizer's own
  /// chat template when its tokenizer_config.json has one; false (`plain`): Braid's
  /// plain template (docs/sources.md).
  bool chat_template = true;
  bool huggingface() const { return type == "huggingface"; }
};

inline constexpr int64_t kDefaultShuffleWindowBytes = int64_t{4} << 20;

struct SourceConfig {
  std::string name;
  std::string path;           ///< as written: a file, a directory or a glob
  /// `sources[].format`: how the files are laid out; kAuto: from the names (Parquet,
  /// Megatron .idx/.bin, JSONL, Hugging Face save_to_disk .arrow, WebDataset .tar). Not
  /// part of the fingerprint: a given format either is the detected one or the source
  /// fails.
  SourceFormat format = SourceFormat::kAuto;
  /// list<int32|int64> column of token ids; a Megatron dataset has none (its documents
  /// are the tokens), so it may be empty there.
  std::string tokens_column;
  /// `sources[].length_column`: an integer column holding each row's token count (the
  /// length of its token list); planning reads it alone, a run checks it against the
  /// token lists (docs/sources.md). Only with tokens_column; "" none. Not part of the
  /// stream: a length that disagrees with its token list is an error, never a change.
  std::string length_column;
  WeightSchedule weight;
  Oversize oversize = Oversize::kSplit;
  OnError on_error = OnError::kFail;
  int64_t shuffle_window_rows = 4096;  ///< rows shuffled together (>= 1; 1 = file order)
  /// Most bytes (footer estimate) in one shuffle window; larger row groups are read in
  /// blocks. 0: windows bounded in rows only (the order before this bound existed).
  int64_t shuffle_window_bytes = kDefaultShuffleWindowBytes;

  // The transform (docs/sources.md): exactly one of tokens_column, text_column, chat and
  // user_transform.
  std::string text_column;  ///< string column, tokenized with Config::tokenizer
  ChatColumns chat;         ///< chat / instruction columns, tokenized with the tokenizer
  /// `sources[].tokenizer`: this source's own tokenizer; model empty: Config::tokenizer.
  TokenizerConfig tokenizer;
  int64_t workers = 1;      ///< transform threads of this source's loader (>= 1)
  /// `transform: {python: SPEC, columns: [...]}`: a user function over the named columns
  /// (transform/user_transform.h); `python` empty: none. Instead of tokens_column etc.
  struct UserTransform {
    std::string python;  ///< "package.module:function", or a registered name
    std::vector<std::string> columns;
    /// The function takes a batch (one list per column) and returns one result per row,
    /// rather than one row per call. The stream is the same either way.
    bool batched = false;
    bool enabled() const { return !python.empty(); }
  };
  UserTransform user_transform;
  /// Loader instances that share the source's shuffle windows (window w goes to loader
  /// w % loaders); the stream is the same for any value (source/sharded_source.h).
  int64_t loaders = 1;
  // Images (docs/sources.md, the image-caption transform); only with text_column.
  /// Binary column of encoded JPEG / PNG / WebP bytes. A WebDataset source names member
  /// extensions: `image_column: [jpg, png]` (or "jpg;png", webdataset's own spelling) is
  /// kept as "jpg;png", the first of them a sample has.
  std::string image_column;
  int64_t image_patch_size = 14;  ///< image.patch_size
  int64_t image_max_pixels = 262144;  ///< image.max_pixels
  int64_t image_token_id = -1;    ///< image.image_token_id (required with image_column)
  /// image.folder: where the relative image paths of a JSON Lines source's image field
  /// are found (a local folder or a URI on the source's filesystem); "" the folder of
  /// the records' file. Not part of the fingerprint (as `path` is not).
  std::string image_folder;

  // Storage (docs/config.md); credentials come from the environment.
  std::string storage_endpoint;  ///< e.g. "http://127.0.0.1:9000" for a local S3 server
  std::string storage_region;
  bool storage_anonymous = false;  ///< gs:// without credentials (public buckets, emulators)
  std::string cache_dir;        ///< runtime.cache.dir, copied here; empty: no cache
  int64_t cache_max_bytes = 0;  ///< runtime.cache.max_bytes
  /// runtime.length_cache, copied here; empty: planning encodes every row it counts.
  std::string length_cache_dir;
};

/// A parallel dimension of the trainer's layout.
enum class Dim : int8_t { kDp = 0, kTp = 1, kPp = 2, kCp = 3 };
const char* ToString(Dim d);

/// The trainer's layout as a tree of its parallel dimensions (docs/parallelism.md): their
/// sizes, the rank order, which dimensions receive different buckets of each step's
/// sequences (distribute) and which receive the same micro-batches (broadcast_at).
struct Topology {
  int64_t dp = 1, tp = 1, pp = 1, cp = 1;
  /// Rank order, the fastest-varying dimension first (topology.order). Default: Megatron's,
  /// rank = tp + TP * (cp + CP * (dp + DP * pp)). INVARIANT: a permutation of the four.
  std::array<Dim, 4> order = {Dim::kTp, Dim::kCp, Dim::kDp, Dim::kPp};
  /// distribute(axis, group): kDp, one bucket per DP rank (CP ranks get slices of it);
  /// kCp, one per (dp, cp) pair (CP ranks get whole sequences); kWorld, one per rank, less
  /// the dimensions broadcast at.
  enum class Axis : int8_t { kDp, kCp, kWorld };
  Axis distribute = Axis::kDp;
  /// Consecutive bucket slots (over the distributed dimensions, in rank order) that share
  /// one bucket. INVARIANT: divides the product of the distributed dimensions' sizes.
  int64_t group = 1;
  /// broadcast_at: whether the TP / PP ranks of a bucket receive its micro-batches (TP
  /// copies, PP stage views). Always true unless distribute is kWorld.
  bool broadcast_tp = true, broadcast_pp = true;

  int64_t world_size() const { return dp * tp * pp * cp; }
  int64_t size(Dim d) const {
    const int64_t sizes[] = {dp, tp, pp, cp};
    return sizes[static_cast<int>(d)];
  }
  /// True if the ranks along `d` receive different buckets.
  bool distributed(Dim d) const {
    switch (d) {
      case Dim::kDp: return true;
      case Dim::kCp: return distribute != Axis::kDp;
      case Dim::kTp: return distribute == Axis::kWorld && !broadcast_tp;
      case Dim::kPp: return distribute == Axis::kWorld && !broadcast_pp;
    }
    return false;
  }
  /// True if CP ranks receive zigzag slices of their bucket's sequences.
  bool slices_context() const { return cp > 1 && !distributed(Dim::kCp); }
  /// The number of buckets each step's sequences are balanced over (== dp by default).
  int64_t buckets() const {
    int64_t n = 1;
    for (Dim d : order) n *= distributed(d) ? size(d) : 1;
    return n / group;
  }
};

struct BatchConfig {
  int64_t global_tokens = 0;  ///< tokens per global step, over all DP ranks
  int64_t seq_len = 0;
  int64_t micro_batch_size = 1;  ///< sequences per micro-batch
  bool packing = true;
  /// batch.pad_to_multiple_of: every document is planned as its length rounded up to a
  /// multiple of this (1: off), so every piece's length, and every piece boundary, is a
  /// multiple of it; the constructor fills the rounding with pad tokens that have no
  /// target (docs/config.md). For a trainer that cuts each piece into 2*cp chunks
  /// (Megatron-LM's packed THD path with context parallelism).
  int64_t pad_to_multiple_of = 1;
};

struct BalanceConfig {
  double attn = 1.0;    ///< cost coefficient of L^2 (causal attention)
  double linear = 0.0;  ///< cost coefficient of L (MLP, projections)
  double vision = 0.0;  ///< cost coefficient of a document's image tokens (vision encoder)
  /// kHybrid: sequence cost = backbone + vision * image tokens; kBackbone: vision ignored
  /// (docs/planner.md).
  enum class CostMode { kBackbone, kHybrid };
  CostMode cost_mode = CostMode::kHybrid;
  BalanceAlgorithm algorithm = BalanceAlgorithm::kKarmarkarKarp;
  /// How a document longer than `max_piece` (0: the step's seq_len) is cut before
  /// packing: kBoundary where a sequence ends: under mix.exact: step by the packer,
  /// under time every max_piece tokens from a seeded offset (as the sequence ends of
  /// concatenated documents would cut it); kAligned every max_piece tokens from the
  /// document's start (under time; as kBoundary under step); kEven into
  /// ceil(len / max_piece) near-equal pieces.
  enum class Split { kBoundary, kAligned, kEven };
  Split split = Split::kBoundary;
  int64_t max_piece = 0;
  /// Token slack: each sequence is packed to seq_len - round(slack * seq_len) tokens (the
  /// step's token budget), and the balancer may then move whole pieces between the
  /// sequences of different ranks, up to seq_len each, to even the ranks' costs. 0: off.
  double slack = 0.0;
};

/// How the planner keeps the mix's token shares (`mix.exact`).
struct MixConfig {
  /// kTime: shares exact over time. Each source's cumulative tokens stay within a
  /// sequence length of its share of the tokens planned, and a step takes whole
  /// documents, cut only where a sequence ends, by `oversize` or by `max_piece`.
  /// kStep: every step's tokens per source are exact; the document that overflows a
  /// source's quota is cut there and continues at the next step.
  enum class Exact { kTime, kStep };
  Exact exact = Exact::kTime;
};
/// Steps [previous phase's until_step, until_step) use this phase's sequence length and
/// weight overrides; steps after the last phase use batch.seq_len and the sources' weights.
struct PhaseConfig {
  int64_t until_step = 0;
  int64_t seq_len = 0;  ///< tokens per sequence in this phase (global_tokens is constant)
  /// Per source (config order): the weight during this phase, or nullopt to keep the
  /// source's own weight. Schedules use the global step.
  std::vector<std::optional<WeightSchedule>> weights;
};

struct RuntimeConfig {
  /// Upper bound on the bytes each source loader holds ahead (its share of memory_bytes
  /// applies when smaller).
  int64_t read_ahead_bytes = int64_t{64} << 20;
  int64_t prefetch_steps = 2;  ///< step plans computed ahead
  /// Reader/transform threads shared by every source loader; 0: the machine's cores.
  int64_t threads = 0;
  /// runtime.autoscale: share the threads and the memory budget by each source's
  /// measured cost and its weights over the steps ahead (exec/allocation.h); false: the
  /// fixed allocation (configured workers, the budget by the weights at step 0).
  bool autoscale = true;
  /// The source loaders' memory budget, shared by weight (exec/budget.h); 0: derived
  /// from the job (DefaultMemoryBytes).
  int64_t memory_bytes = 0;
  // The distributed runtime (docs/distributed.md; runtime.kind: ray).
  enum class Kind : int8_t { kLocal, kRay };
  Kind kind = Kind::kLocal;
  std::string address = "auto";   ///< runtime.address: the Ray cluster to join
  std::string ray_namespace = "braid";  ///< runtime.namespace of the job's named actors
  /// runtime.job: the job's name (its actors' prefix); empty: derived from the config's
  /// fingerprint and start state, so every rank of one job finds the same actors.
  std::string job;
  /// runtime.source_actors: processes of their own that serve the sources' payloads; 0:
  /// the planner's; -1 (unset): the host process of the job's first node, beside its
  /// constructor (service/hosting.h).
  int64_t source_actors = -1;
  int64_t steps_in_flight = 2;   ///< runtime.steps_in_flight: steps built ahead
  double timeout_s = 120;        ///< runtime.timeout_s: the longest wait on any actor
  /// runtime.actor_resources: Ray resources the planner and source actors require (to
  /// place them on chosen nodes), in config order.
  std::vector<std::pair<std::string, double>> actor_resources;
  /// runtime.shadow: a hot-standby copy of each source actor, spread to another node;
  /// a constructor whose fetch finds the source actor dead asks its shadow at once.
  bool shadow = false;
  /// runtime.delivery: how a trainer receives its micro-batches from its node's
  /// constructor. kNode: a Unix socket and one shared-memory file per view, so the
  /// trainer runs no Ray driver; kObjectStore: Ray's object store (the trainer joins Ray).
  enum class Delivery : int8_t { kNode, kObjectStore };
  Delivery delivery = Delivery::kNode;
};

struct Config {
  uint64_t seed = 0;
  Topology topology;
  BatchConfig batch;
  BalanceConfig balance;
  MixConfig mix;  ///< planner: how shares are kept exact
  std::vector<SourceConfig> sources;
  RuntimeConfig runtime;
  TokenizerConfig tokenizer;  ///< for text_column / chat sources
  /// The tokenizer of sources[i]: its own `tokenizer`, else the root one (model empty:
  /// none).
  const TokenizerConfig& TokenizerFor(size_t i) const {
    return sources[i].tokenizer.model.empty() ? tokenizer : sources[i].tokenizer;
  }
  std::vector<PhaseConfig> phases;  ///< planner: until_step strictly increasing
  /// The text ParseConfig read this config from (with base_dir), so a copy can be
  /// re-parsed in another process (the Ray runtime's actors); not in the fingerprint.
  std::string source_text;
  std::string base_dir;  ///< relative source paths resolve against this folder

  /// Sequences in one global step (global_tokens / seq_len); independent of dp.
  int64_t sequences_per_step() const { return batch.global_tokens / batch.seq_len; }
  /// Micro-batches each bucket (DP rank, by default) receives per step.
  int64_t micro_batches_per_rank() const {
    return sequences_per_step() / (topology.buckets() * batch.micro_batch_size);
  }
  /// The phase that holds `step` (docs/planner.md), or null after the last phase.
  const PhaseConfig* PhaseAt(int64_t step) const;
  /// The sequence length at `step`: its phase's, else batch.seq_len.
  int64_t SeqLenAt(int64_t step) const;
  /// Source `source`'s weight at `step` (its phase's override, else its own schedule).
  double WeightAt(size_t source, int64_t step) const;
  int64_t SequencesAt(int64_t step) const { return batch.global_tokens / SeqLenAt(step); }
  int64_t MicroBatchesPerRankAt(int64_t step) const {
    return SequencesAt(step) / (topology.buckets() * batch.micro_batch_size);
  }

  /// Hash of everything that determines the sample stream (seed, sources, sequence
  /// shape); weights and topology are excluded so a run may resume with new ones.
  std::string Fingerprint() const;
};

/// Parses YAML (or JSON) text. Relative paths resolve against `base_dir`; nothing on disk
/// is read. Fails with a ConfigError naming the key path on any bad key or value (also
/// where aliases expand the document past its size), or the key "config" with a line and
/// column for text that is not valid YAML or UTF-8 or nests deeper than kMaxConfigDepth
/// (docs/config.md, "Errors and limits"). Never throws.
Result<Config> ParseConfig(const std::string& text, const std::string& base_dir);

/// Containers nested deeper than this are rejected before yaml-cpp parses them (its
/// parser recurses once per level). A config needs 8.
inline constexpr int kMaxConfigDepth = 64;

/// `text` made safe to quote in a one-line error message: valid UTF-8, control characters
/// and invalid bytes written as \xNN, cut after `max_bytes` with the full size noted.
std::string EscapeForMessage(std::string_view text, size_t max_bytes = 80);

/// Reads and parses a config file; relative paths resolve against its folder.
Result<Config> LoadConfigFile(const std::string& path);

/// Overrides topology.dp (the CLI's --dp) and re-checks the batch shape.
Status SetDataParallel(Config* config, int64_t dp);

/// Checks the topology tree: topology.order a permutation, the distribute group dividing
/// the distributed ranks. Fails naming the key.
Status CheckTopology(const Topology& topology);

/// Checks the cross-field rules (batch shape divisible by topology, weights not all 0).
Status ValidateConfig(const Config& config);

}  // namespace braid
