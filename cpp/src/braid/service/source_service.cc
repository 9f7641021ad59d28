#include "braid/service/source_service.h"

#include <algorithm>
#include <string>

#include "braid/exec/budget.h"
#include "braid/exec/read_pool.h"
#include "braid/source/sharded_source.h"
#include "braid/source/source_loader.h"
#include "braid/util/cpu_time_internal.h"

namespace braid {
namespace {

int64_t ColumnsBytes(const Columns& cols) {
  int64_t bytes = 0;
  for (const auto& array : cols) {
    for (const auto& buffer : array->data()->buffers) {
      if (buffer) bytes += buffer->size();
    }
    for (const auto& child : array->data()->child_data) {
      for (const auto& buffer : child->buffers) {
        if (buffer) bytes += buffer->size();
      }
    }
  }
  return bytes;
}

// What keeping a row's payload costs beyond its bytes (the map node, the handle).
constexpr int64_t kKeptRowOverheadBytes = 96;

}  // namespace

Result<std::unique_ptr<SourceService>> SourceService::Make(const Config& config,
                                                           int32_t source_index,
                                                           Options options) {
  const std::string key = "sources[" + std::to_string(source_index) + "]";
  const SourceConfig& source = config.sources[size_t(source_index)];
  std::unique_ptr<SourceService> service(new SourceService());
  service->config_ = config;
  service->source_index_ = source_index;
  if (options.stream != Stream::kNone) {
    SourceLoader::Options loader;
    loader.read_payloads = options.stream != Stream::kMetadata;
    loader.own_payloads = options.stream == Stream::kOwnPayloads;
    loader.read_ahead_bytes = options.read_ahead_bytes;
    loader.pool = options.pool;
    ARROW_ASSIGN_OR_RAISE(service->stream_,
                          ShardedSource::Make(config, source_index, options.start, loader,
                                              source.loaders));
  }
  if (options.serve) {
    service->cache_bytes_ = std::max<int64_t>(
        options.cache_bytes > 0 ? options.cache_bytes
                                : SourceShares(config)[size_t(source_index)],
        1);
    ARROW_ASSIGN_OR_RAISE(service->transform_, MakeTransform(config, source_index));
    std::vector<ColumnSpec> columns = service->transform_->columns();
    if (columns.empty()) {
      columns.push_back(TokenColumnSpec(source.tokens_column, key + ".tokens_column"));
    }
    ARROW_ASSIGN_OR_RAISE(service->files_,
                          SourceFiles::Open(source, key, std::move(columns)));
    service->pool_ = options.pool;
  }
  return service;
}

SourceService::~SourceService() {
  if (stream_) stream_->RequestStop();  // then its destructor waits
}

SampleStream* SourceService::stream() { return stream_.get(); }

void SourceService::SetShare(const SourceShare& share) {
  if (stream_) stream_->SetShare(share);
}

void SourceService::Start() {
  if (stream_) stream_->Start();
}

void SourceService::RequestStop() {
  if (stream_) stream_->RequestStop();
}

void SourceService::Stop() {
  if (stream_) stream_->Stop();
}

int64_t SourceService::blanked_payloads() const {
  return stream_ ? stream_->blanked_payloads() : 0;
}

SourceProfile SourceService::profile() const {
  return stream_ ? stream_->profile() : SourceProfile{};
}

int64_t SourceService::skipped_files() const {
  return stream_ ? static_cast<int64_t>(stream_->skipped_files().size()) : 0;
}

int64_t SourceService::workers() const { return stream_ ? stream_->workers() : 0; }

int64_t SourceService::unreadable_files() const {
  return stream_ ? stream_->unreadable_files() : 0;
}

int64_t SourceService::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

int64_t SourceService::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

ServeProfile SourceService::serve_profile() const {
  std::lock_guard<std::mutex> lock(mu_);
  ServeProfile p = served_;
  p.calls = requests_;
  p.cached_bytes = cached_;
  return p;
}

Result<SourceService::Unit*> SourceService::UnitFor(int32_t file, int64_t row,
                                                      int32_t* row_group) {
  const auto& list = files_->files();
  const std::string key = "sources[" + std::to_string(source_index_) + "]";
  if (file < 0 || static_cast<size_t>(file) >= list.size()) {
    return DataError(key, "no file " + std::to_string(file) + " (the source has " +
                              std::to_string(list.size()) + ")");
  }
  const SourceFiles::File& f = list[size_t(file)];
  if (row < 0 || row >= f.num_rows) {
    return DataError(f.path, "no row " + std::to_string(row) + " (the file has " +
                                 std::to_string(f.num_rows) + ")");
  }
  const auto it = std::upper_bound(f.row_group_first_row.begin(),
                                   f.row_group_first_row.end(), row);
  const int32_t rg = static_cast<int32_t>(it - f.row_group_first_row.begin()) - 1;
  *row_group = rg;
  const int64_t rg_rows = f.row_group_rows[size_t(rg)];
  const int64_t rg_bytes =
      size_t(rg) < f.row_group_bytes.size() ? f.row_group_bytes[size_t(rg)] : 0;
  const int64_t block_rows = BlockRows(
      rg_rows, rg_bytes, config_.sources[size_t(source_index_)].shuffle_window_bytes);
  const int64_t in_rg = row - f.row_group_first_row[size_t(rg)];
  const int64_t block = block_rows == 0 ? 0 : in_rg / block_rows;
  const UnitKey key_tuple{file, rg, block};
  auto found = cache_.find(key_tuple);
  if (found != cache_.end()) {
    lru_.splice(lru_.begin(), lru_, found->second.lru);
    return &found->second;
  }
  Unit unit;
  unit.first_row = f.row_group_first_row[size_t(rg)] + block * block_rows;
  if (block_rows == 0) {
    ARROW_ASSIGN_OR_RAISE(Columns cols, files_->ReadColumns(file, rg));
    unit.chunks.push_back(std::move(cols));
  } else {
    ARROW_ASSIGN_OR_RAISE(unit.chunks, files_->ReadBlock(file, rg, block_rows, block));
  }
  int64_t first = 0;
  for (const Columns& cols : unit.chunks) {
    unit.chunk_first.push_back(first);
    first += cols.empty() ? 0 : cols[0]->length();
    unit.bytes += ColumnsBytes(cols);
  }
  lru_.push_front(EntryKey{key_tuple});
  unit.lru = lru_.begin();
  cached_ += unit.bytes;
  ++served_.units_read;
  served_.bytes_read += unit.bytes;
  Unit* added = &cache_.emplace(key_tuple, std::move(unit)).first->second;
  Trim();
  return added;
}

void SourceService::Trim() {
  while (lru_.size() > 1 && cached_ > cache_bytes_) {
    if (const auto* unit = std::get_if<UnitKey>(&lru_.back())) {
      auto oldest = cache_.find(*unit);
      cached_ -= oldest->second.bytes;
      cache_.erase(oldest);
    } else {
      auto oldest = kept_.find(std::get<RowKey>(lru_.back()));
      cached_ -= oldest->second.bytes;
      kept_.erase(oldest);
    }
    lru_.pop_back();
  }
  served_.peak_cached_bytes = std::max(served_.peak_cached_bytes, cached_);
}

void SourceService::ServeFromPlans(PlannedPayloads planned) {
  std::lock_guard<std::mutex> lock(mu_);
  planned_ = std::move(planned);
}

Result<SourceService::Located> SourceService::Locate(int32_t file, int64_t row) {
  Located at;
  ARROW_ASSIGN_OR_RAISE(Unit * unit, UnitFor(file, row, &at.row_group));
  const int64_t in_unit = row - unit->first_row;
  const auto chunk_it =
      std::upper_bound(unit->chunk_first.begin(), unit->chunk_first.end(), in_unit);
  const size_t chunk = size_t(chunk_it - unit->chunk_first.begin()) - 1;
  at.cols = unit->chunks[chunk];
  at.index = in_unit - unit->chunk_first[chunk];
  return at;
}

TokenPayload SourceService::FromPlans(int32_t file, int64_t row) {
  if (!planned_) return nullptr;
  const PayloadRef ref = planned_(source_index_, file, row);
  if (!ref || !ref.ready()) return nullptr;
  auto got = ref.Get();
  return got.ok() ? *got : nullptr;
}

SourceService::TransformedRows SourceService::TransformAhead(const int64_t* requests,
                                                             int64_t n) {
  TransformedRows ahead;
  if (pool_ == nullptr || pool_->threads() < 2 || n < 2 ||
      !config_.sources[size_t(source_index_)].tokens_column.empty()) {
    return ahead;  // one thread, one row, or a view of a token column: nothing to share
  }
  std::vector<std::pair<RowKey, Transformed*>> todo;  // map nodes stay where they are
  for (int64_t k = 0; k < n; ++k) {
    const int64_t* q = requests + k * kRequestFields;
    const RowKey key{static_cast<int32_t>(q[0]), q[1]};
    if (kept_.count(key) > 0 || ahead.count(key) > 0) continue;
    if (FromPlans(key.first, key.second) != nullptr) continue;
    auto at = Locate(key.first, key.second);
    if (!at.ok()) break;  // Row finds the same error in its turn
    Transformed& t = ahead[key];
    t.at = std::move(*at);
    todo.emplace_back(key, &t);
  }
  if (todo.size() < 2) return {};
  served_.cpu_ns += pool_->ParallelFor(
      static_cast<int64_t>(todo.size()), pool_->threads(), [&](int64_t i) {
        const auto& [key, t] = todo[size_t(i)];
        const std::string& path = files_->files()[size_t(key.first)].path;
        t->status = transform_->Apply(t->at.cols, t->at.index, /*want_payload=*/true,
                                      RowLocation{&path,
                                                  files_->NamedRowGroup(t->at.row_group),
                                                  key.second},
                                      &t->out);
      });
  served_.rows_transformed += static_cast<int64_t>(todo.size());
  return ahead;
}

Result<TokenPayload> SourceService::Row(int32_t file, int64_t row, bool more,
                                        std::vector<std::string_view>* encoded,
                                        const TransformedRows& ahead) {
  if (auto kept = kept_.find(RowKey{file, row}); kept != kept_.end()) {
    *encoded = kept->second.encoded;
    TokenPayload payload = kept->second.payload;
    if (more) {
      lru_.splice(lru_.begin(), lru_, kept->second.lru);
    } else {  // the row's last piece: the kept payload goes
      cached_ -= kept->second.bytes;
      lru_.erase(kept->second.lru);
      kept_.erase(kept);
    }
    return payload;
  }
  // The planner beside it holds the row's payload: no read, no transform.
  if (TokenPayload planned = FromPlans(file, row); planned != nullptr) {
    encoded->clear();
    ++served_.pieces_from_plans;
    return planned;
  }
  Located at;
  RowOutput out;
  const SourceFiles::File& f = files_->files()[size_t(file)];
  if (auto done = ahead.find(RowKey{file, row}); done != ahead.end()) {
    at = done->second.at;
    ARROW_RETURN_NOT_OK(done->second.status);
    out = done->second.out;
  } else {
    ARROW_ASSIGN_OR_RAISE(at, Locate(file, row));
    ++served_.rows_transformed;
    ARROW_RETURN_NOT_OK(transform_->Apply(at.cols, at.index, /*want_payload=*/true,
                                          RowLocation{&f.path,
                                                      files_->NamedRowGroup(at.row_group),
                                                      row},
                                          &out));
  }
  const Columns& cols = at.cols;
  const int64_t index = at.index;
  const RowLocation where{&f.path, files_->NamedRowGroup(at.row_group), row};
  if (out.skip != SkipReason::kNone || out.payload == nullptr) {
    return DataError(where.ToString(), "the row has no tokens now (" +
                                           (out.null_what.empty() ? std::string("empty")
                                                                  : out.null_what) +
                                           ") but was planned; did the file change?");
  }
  // A deferred payload's images stay encoded: the constructor decodes them.
  transform_->EncodedImages(cols, index, encoded);
  // A token column's payload is a view of the unit's own ids: nothing to save.
  if (!more || !config_.sources[size_t(source_index_)].tokens_column.empty()) {
    return out.payload;
  }
  // Kept for the row's later pieces, the newest entry of the cache (making room drops
  // others only), with the chunk its encoded images are views into.
  KeptRow kept{out.payload, *encoded, {}, kKeptRowOverheadBytes + out.payload->bytes(),
               {}};
  if (!encoded->empty()) kept.columns = cols;
  for (std::string_view image : *encoded) kept.bytes += int64_t(image.size());
  lru_.push_front(EntryKey{RowKey{file, row}});
  kept.lru = lru_.begin();
  cached_ += kept.bytes;
  kept_.emplace(RowKey{file, row}, std::move(kept));
  Trim();
  return out.payload;
}

Status SourceService::AddImages(const Payload& payload,
                                 const std::vector<std::string_view>& encoded,
                                 int64_t piece, int64_t start, int64_t len, int32_t file,
                                 int64_t row, PieceReply* reply,
                                 std::map<int32_t, int64_t>* path_index) const {
  if (payload.images.empty()) return Status::OK();
  const std::string& path = files_->files()[size_t(file)].path;
  if (encoded.size() != payload.images.size()) {
    return DataError(DataLocation(path, -1, row), "the row's images changed");
  }
  // The images whose placeholders lie in the piece's own tokens (the planner cuts a
  // document after its image tokens, so an image is never split between pieces).
  std::vector<bool> inside(payload.images.size());
  bool all_inside = true;
  for (size_t i = 0; i < payload.images.size(); ++i) {
    const int64_t at = payload.image_start[i];
    const int64_t patches = payload.images[i].num_patches();
    const int64_t overlap =
        std::max<int64_t>(0, std::min(at + patches, start + len) - std::max(at, start));
    if (overlap != 0 && overlap != patches) {  // as the embedded constructor refuses it
      return DataError(DataLocation(path, -1, row),
                       "an image was split (the piece holds " + std::to_string(overlap) +
                           " of its " + std::to_string(patches) +
                           " placeholder tokens); set oversize: skip or raise seq_len");
    }
    inside[i] = overlap == patches && patches > 0;
    all_inside = all_inside && inside[i];
  }
  // on_error: skip blanks a row whose images do not all decode, every piece of it: a
  // piece that lacks some of its row's images gets them too, to check.
  const bool check_others =
      !all_inside && config_.sources[size_t(source_index_)].on_error == OnError::kSkip;
  for (size_t i = 0; i < payload.images.size(); ++i) {
    if (!inside[i] && !check_others) continue;
    auto [it, added] = path_index->emplace(file, int64_t(path_index->size()));
    if (added) {
      reply->paths.insert(reply->paths.end(), path.begin(), path.end());
      reply->paths.push_back(0);
    }
    const ImagePatches& image = payload.images[i];
    reply->images.insert(
        reply->images.end(),
        {piece, inside[i] ? payload.image_start[i] - start : -1, image.grid_h,
         image.grid_w, static_cast<int64_t>(encoded[i].size()), it->second, int64_t(i),
         int64_t(payload.images.size())});
    reply->image_bytes.insert(reply->image_bytes.end(), encoded[i].begin(),
                              encoded[i].end());
  }
  return Status::OK();
}

Result<PieceReply> SourceService::Fetch(const int64_t* requests, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!files_) {
    return ConfigError("sources[" + std::to_string(source_index_) + "]",
                       "this source service does not serve payloads");
  }
  ++requests_;
  const int64_t cpu_start_ns = internal::ThreadCpuNs();
  PieceReply reply;
  reply.offsets.reserve(size_t(n) + 1);
  bool masked = false;
  std::vector<std::string_view> encoded;
  std::map<int32_t, int64_t> path_index;  // file -> its index in reply.paths
  const TransformedRows ahead = TransformAhead(requests, n);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t* q = requests + k * kRequestFields;
    const int32_t file = static_cast<int32_t>(q[0]);
    const int64_t row = q[1], start = q[2], len = q[3], doc_tokens = q[4];
    const bool more = start + len < doc_tokens;  // a later piece of the row follows
    ARROW_ASSIGN_OR_RAISE(TokenPayload payload, Row(file, row, more, &encoded, ahead));
    const std::string& path = files_->files()[size_t(file)].path;
    const int64_t have = static_cast<int64_t>(payload->tokens.size());
    // With batch.pad_to_multiple_of m the plan counts a document's padding too.
    const int64_t m = config_.batch.pad_to_multiple_of;
    if (start < 0 || len < 0 || start + len > doc_tokens ||
        doc_tokens > (have + m - 1) / m * m || start >= have) {
      return DataError(DataLocation(path, -1, row),
                       "the row holds " + std::to_string(have) + " tokens, the plan a " +
                           "piece [" + std::to_string(start) + ", " +
                           std::to_string(start + len) + ") of a " +
                           std::to_string(doc_tokens) +
                           "-token document; did the file change?");
    }
    const int64_t end = std::min({start + len + 1, doc_tokens, have});
    reply.tokens.insert(reply.tokens.end(), payload->tokens.begin() + start,
                        payload->tokens.begin() + end);
    if (!payload->loss_mask.empty()) {
      if (!masked) {  // earlier pieces had none: every token a target
        reply.loss_mask.assign(reply.tokens.size() - size_t(end - start), 1);
        masked = true;
      }
      reply.loss_mask.insert(reply.loss_mask.end(), payload->loss_mask.begin() + start,
                             payload->loss_mask.begin() + end);
    } else if (masked) {
      reply.loss_mask.insert(reply.loss_mask.end(), size_t(end - start), 1);
    }
    ARROW_RETURN_NOT_OK(
        AddImages(*payload, encoded, k, start, len, file, row, &reply, &path_index));
    reply.offsets.push_back(static_cast<int64_t>(reply.tokens.size()));
  }
  served_.pieces += n;
  served_.tokens_sent += int64_t(reply.tokens.size());
  served_.bytes_sent +=
      int64_t(reply.tokens.size() * sizeof(int32_t) + reply.offsets.size() * sizeof(int64_t) +
              reply.loss_mask.size() + reply.images.size() * sizeof(int64_t) +
              reply.image_bytes.size() + reply.paths.size());
  served_.cpu_ns += internal::ThreadCpuNs() - cpu_start_ns;
  return reply;
}

Result<std::unique_ptr<SourceSet>> SourceSet::Open(const Config& config,
                                                   const PlannerState& start,
                                                   SourceService::Stream stream, bool serve,
                                                   const std::vector<int32_t>& which) {
  std::unique_ptr<SourceSet> set(new SourceSet());
  std::vector<int32_t> sources = which;
  if (sources.empty()) {
    for (size_t i = 0; i < config.sources.size(); ++i) sources.push_back(int32_t(i));
  }
  set->pool_ = std::make_shared<ReadPool>(ReadThreads(config));
  const std::vector<int64_t> shares = SourceShares(config);
  const int64_t n = static_cast<int64_t>(sources.size());
  set->services_.resize(size_t(n));
  std::vector<Status> opened(static_cast<size_t>(n));
  // The sources open (listing, footers) in parallel on the pool; the first error in
  // config order is returned.
  set->pool_->ParallelFor(n, OpenThreads(config, *set->pool_), [&](int64_t k) {
    const int32_t i = sources[size_t(k)];
    SourceService::Options options;
    options.stream = stream;
    options.serve = serve;
    options.start = start.sources[size_t(i)].next;
    options.read_ahead_bytes = shares[size_t(i)];
    options.pool = set->pool_;
    auto service = SourceService::Make(config, i, std::move(options));
    if (service.ok()) {
      set->services_[size_t(k)] = std::move(*service);
    } else {
      opened[size_t(k)] = service.status();
    }
  });
  for (const Status& st : opened) ARROW_RETURN_NOT_OK(st);
  return set;
}

SourceSet::~SourceSet() {
  for (auto& s : services_) {
    if (s) s->RequestStop();  // then each destructor waits
  }
}

std::vector<SampleStream*> SourceSet::streams() const {
  std::vector<SampleStream*> out;
  for (const auto& s : services_) out.push_back(s->stream());
  return out;
}

void SourceSet::Start() {
  for (auto& s : services_) s->Start();
}

void SourceSet::SetShares(const std::vector<SourceShare>& shares) {
  for (auto& s : services_) {
    if (size_t(s->source_index()) < shares.size())
      s->SetShare(shares[size_t(s->source_index())]);
  }
}

int64_t SourceSet::threads() const { return pool_ ? pool_->threads() : 1; }

void SourceSet::Stop() {
  for (auto& s : services_) {
    if (s) s->RequestStop();
  }
  for (auto& s : services_) {
    if (s) s->Stop();
  }
}

SourceService* SourceSet::find(int32_t source) const {
  for (const auto& s : services_) {
    if (s->source_index() == source) return s.get();
  }
  return nullptr;
}

std::vector<SourceProfile> SourceSet::profiles() const {
  std::vector<SourceProfile> out;
  for (const auto& s : services_) out.push_back(s ? s->profile() : SourceProfile{});
  return out;
}

std::vector<int64_t> SourceSet::workers() const {
  std::vector<int64_t> out;
  for (const auto& s : services_) out.push_back(s ? s->workers() : 0);
  return out;
}

void SourceSet::ServeFromPlans(const SourceService::PlannedPayloads& planned) {
  for (auto& s : services_) {
    if (s) s->ServeFromPlans(planned);
  }
}

std::vector<ServeProfile> SourceSet::serve_profiles() const {
  std::vector<ServeProfile> out;
  for (const auto& s : services_) out.push_back(s ? s->serve_profile() : ServeProfile{});
  return out;
}

std::vector<int64_t> SourceSet::blanked_payloads() const {
  std::vector<int64_t> out;
  for (const auto& s : services_) out.push_back(s ? s->blanked_payloads() : 0);
  return out;
}

std::vector<int64_t> SourceSet::skipped_files() const {
  std::vector<int64_t> out;
  for (const auto& s : services_) out.push_back(s ? s->skipped_files() : 0);
  return out;
}

std::vector<int64_t> SourceSet::unreadable_files() const {
  std::vector<int64_t> out;
  for (const auto& s : services_) out.push_back(s ? s->unreadable_files() : 0);
  return out;
}

}  // namespace braid
