// What loading one source costs, measured while it runs: the per-source profile.
//
// A SourceLoader counts, on the pool threads that do its work, the CPU time of its read
// steps (reading and decompressing row groups, the transform of each row: token column,
// tokenizer, chat template, a user function, image headers) and of its deferred payloads
// (image decode, resize and patches), the bytes of the columns it read, and the samples
// and tokens it produced, and how long its consumer waited for it. The clock is read once
// per read step and once per helper thread of its transform loop (exec/read_pool.h
// ParallelFor), and once per deferred payload, never per row. A ShardedSource and a
// SourceSet sum their loaders'; the embedded Engine, `braid run` (report.json
// `source_profile`) and the Ray planner host's figures (`braid status`) report them. This
// is the input the auto-partitioning of issue 21 sizes source loaders from.
//
// It also keeps what the loader holds (held_bytes, peak_held_bytes): the bytes of the
// samples queued ahead of the consumer, charged as the memory budget charges them (a
// payload's bytes, or without payloads the bytes its row decoded to), now and at most.
//
// What it does not count: the Ray runtime's piece fetches (their own figures:
// service/source_service.h ServeProfile) and the images a constructor decodes from
// fetched pieces (wire.h AttachPieces) run outside the source loaders.
//
// A read step is counted before its samples are queued: a consumer never holds a sample
// its profile does not count yet.
//
// SourceProfile is a value. ProfileCounters is thread-safe (relaxed atomics: each figure
// is exact, a snapshot taken while loading runs may mix two moments).
#pragma once

#include <atomic>
#include <cstdint>

namespace braid {

/// One source's loading cost so far (or a sum over loaders).
struct SourceProfile {
  int64_t samples = 0;       ///< samples produced (rows with tokens; skips not counted)
  int64_t tokens = 0;        ///< their tokens (image placeholders included)
  int64_t rows_read = 0;     ///< rows transformed (skips included)
  int64_t bytes_read = 0;    ///< bytes of the columns read (Arrow buffers, decompressed)
  int64_t read_cpu_ns = 0;   ///< thread CPU of read steps (read, decode, transform)
  int64_t payloads_finished = 0;  ///< deferred payloads finished (images decoded)
  int64_t finish_cpu_ns = 0;      ///< thread CPU of those payloads
  /// Wall time the stream's consumer (the planner) waited in Next() for a sample that
  /// was not read yet: the source held the planning up.
  int64_t consumer_wait_ns = 0;
  /// Bytes queued ahead of the consumer now, and the most so far (gauges, not costs: a
  /// sum over loaders adds each loader's figure, so the peak is at most their sum).
  int64_t held_bytes = 0;
  int64_t peak_held_bytes = 0;

  SourceProfile& operator+=(const SourceProfile& o) {
    samples += o.samples;
    tokens += o.tokens;
    rows_read += o.rows_read;
    bytes_read += o.bytes_read;
    read_cpu_ns += o.read_cpu_ns;
    payloads_finished += o.payloads_finished;
    finish_cpu_ns += o.finish_cpu_ns;
    consumer_wait_ns += o.consumer_wait_ns;
    held_bytes += o.held_bytes;
    peak_held_bytes += o.peak_held_bytes;
    return *this;
  }

  /// CPU seconds per sample of read + decode + transform: the read steps' CPU per sample
  /// produced plus, where payloads were finished later, their CPU per payload (0 when
  /// nothing was produced).
  double cpu_s_per_sample() const {
    double s = samples > 0 ? 1e-9 * double(read_cpu_ns) / double(samples) : 0.0;
    if (payloads_finished > 0) {
      s += 1e-9 * double(finish_cpu_ns) / double(payloads_finished);
    }
    return s;
  }
  /// cpu_s_per_sample() over the mean tokens of a sample (0 without tokens).
  double cpu_s_per_token() const {
    return tokens > 0 ? cpu_s_per_sample() * double(samples) / double(tokens) : 0.0;
  }
  /// Bytes of columns read per sample produced (0 when none).
  double bytes_per_sample() const {
    return samples > 0 ? double(bytes_read) / double(samples) : 0.0;
  }
};

/// The counters behind a SourceProfile. Thread-safe.
class ProfileCounters {
 public:
  /// One read step: `cpu_ns` on every thread that ran it, `rows` transformed, of which
  /// `samples` with `tokens` tokens.
  void AddReadStep(int64_t cpu_ns, int64_t rows, int64_t samples, int64_t tokens) {
    read_cpu_ns_.fetch_add(cpu_ns, std::memory_order_relaxed);
    rows_read_.fetch_add(rows, std::memory_order_relaxed);
    samples_.fetch_add(samples, std::memory_order_relaxed);
    tokens_.fetch_add(tokens, std::memory_order_relaxed);
  }
  void AddBytesRead(int64_t bytes) {
    bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
  }
  /// One deferred payload finished in `cpu_ns`.
  void AddFinish(int64_t cpu_ns) {
    finish_cpu_ns_.fetch_add(cpu_ns, std::memory_order_relaxed);
    payloads_finished_.fetch_add(1, std::memory_order_relaxed);
  }
  /// The consumer waited `ns` for a sample.
  void AddConsumerWait(int64_t ns) {
    consumer_wait_ns_.fetch_add(ns, std::memory_order_relaxed);
  }
  /// The loader's queue holds `bytes` now.
  void SetHeld(int64_t bytes) {
    held_bytes_.store(bytes, std::memory_order_relaxed);
    int64_t peak = peak_held_bytes_.load(std::memory_order_relaxed);
    while (bytes > peak &&
           !peak_held_bytes_.compare_exchange_weak(peak, bytes, std::memory_order_relaxed)) {
    }
  }
  SourceProfile Snapshot() const {
    SourceProfile p;
    p.samples = samples_.load(std::memory_order_relaxed);
    p.tokens = tokens_.load(std::memory_order_relaxed);
    p.rows_read = rows_read_.load(std::memory_order_relaxed);
    p.bytes_read = bytes_read_.load(std::memory_order_relaxed);
    p.read_cpu_ns = read_cpu_ns_.load(std::memory_order_relaxed);
    p.payloads_finished = payloads_finished_.load(std::memory_order_relaxed);
    p.finish_cpu_ns = finish_cpu_ns_.load(std::memory_order_relaxed);
    p.consumer_wait_ns = consumer_wait_ns_.load(std::memory_order_relaxed);
    p.held_bytes = held_bytes_.load(std::memory_order_relaxed);
    p.peak_held_bytes = peak_held_bytes_.load(std::memory_order_relaxed);
    return p;
  }

 private:
  std::atomic<int64_t> samples_{0}, tokens_{0}, rows_read_{0}, bytes_read_{0};
  std::atomic<int64_t> read_cpu_ns_{0}, payloads_finished_{0}, finish_cpu_ns_{0};
  std::atomic<int64_t> consumer_wait_ns_{0};
  std::atomic<int64_t> held_bytes_{0}, peak_held_bytes_{0};
};

}  // namespace braid
