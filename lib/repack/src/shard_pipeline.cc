#include "shard_pipeline.h"

#include <chrono>
#include <span>

#include "k3/core/log.h"
#include "k3/repack/repack.h"
#include "transform.h"

namespace k3::repack {

ShardPipeline::ShardPipeline(const ShardPlan& p, std::vector<Segment> segs, uint64_t block_bytes,
                             size_t depth, size_t reads, StreamBuffers* bufs,
                             std::atomic<uint64_t>* progress, const UniqueFd& direct_fd,
                             int read_delay_ms)
    : p_(p),
      segs_(std::move(segs)),
      reserve_{ReserveBytes(segs_, block_bytes, false), ReserveBytes(segs_, block_bytes, true)},
      reads_(reads),
      bufs_(bufs),
      // Read blocks: `depth` queued plus one per further read in flight.
      pool_blocks_{depth + reads - 1, depth},
      // The read pool's queue also takes the blocks helpers bring (Help).
      pools_{BoundedQueue<AlignedBuffer>(depth + reads - 1 + kMaxStreams * kMaxReadsInFlight),
             BoundedQueue<AlignedBuffer>(depth)},
      write_q_(depth),
      direct_fd_(direct_fd),
      use_direct_(direct_fd.valid()),
      src_written_(*progress),
      read_delay_ms_(read_delay_ms) {
  for (int k = 0; k < 2; ++k) {
    bufs_->blocks[k].resize(pool_blocks_[k]);
    for (AlignedBuffer& b : bufs_->blocks[k]) pools_[k].Push(std::move(b));
    bufs_->blocks[k].clear();
  }
}

void ShardPipeline::Abort() {
  Fail(std::make_exception_ptr(Error(ErrorCode::kInternal, "shard pipeline abandoned", p_.src->path())));
}

bool ShardPipeline::Failed() {
  std::lock_guard<std::mutex> lock(err_mu_);
  return err_ != nullptr;
}

void ShardPipeline::RethrowIfFailed() {
  std::lock_guard<std::mutex> lock(err_mu_);
  if (err_) std::rethrow_exception(err_);
}

void ShardPipeline::AddHelper() {
  std::lock_guard<std::mutex> lock(helpers_mu_);
  ++helpers_;
  ++helpers_lent_;
}

void ShardPipeline::Help(std::vector<AlignedBuffer>* blocks, size_t readers) {
  for (AlignedBuffer& b : *blocks) pools_[0].Push(std::move(b));  // (a closed pool drops them)
  blocks->clear();
  RunReaders(readers);
  std::lock_guard<std::mutex> lock(helpers_mu_);
  --helpers_;
  helpers_cv_.notify_all();
}

void ShardPipeline::WaitHelpers() {
  std::unique_lock<std::mutex> lock(helpers_mu_);
  helpers_cv_.wait(lock, [&] { return helpers_ == 0; });
}

size_t ShardPipeline::helpers_lent() {
  std::lock_guard<std::mutex> lock(helpers_mu_);
  return helpers_lent_;
}

void ShardPipeline::Transform(const std::function<int()>& threads) {
  std::vector<float>& scratch = bufs_->scratch;
  std::vector<float> scales;  // the current quantized tensor's scales
  Block b;
  while (TakeRead(&b)) {
    if (b.seg == SIZE_MAX) {
      write_q_.Push(std::move(b));
      return;
    }
    const Segment& s = segs_[b.seg];
    const Item& it = p_.items[s.item];
    // The source bytes as read, in segment (= output) order: what the
    // shard was made from (k3-repack.sources). No second read: the block
    // is hashed here, where it is already in cache for the quantizer.
    if (s.kind != Segment::kScales)
      src_hash_.Update(std::span<const std::byte>(b.bytes.data() + b.skip, s.src_len));
    if (s.kind == Segment::kQuant) {
      if (s.row0 == 0) scales.assign(it.rows * it.qshape.scales_per_row(it.cols), 0.0f);
      Block o;
      o.seg = b.seg;
      if (!pools_[1].Pop(&o.bytes)) return;
      o.pool = 1;
      o.bytes.Reserve(reserve_[1]);
      const int n_threads = threads();
      const size_t need = QuantizeScratchFloats(it.cols, n_threads);
      if (scratch.size() < need) scratch.resize(need);
      QuantizeBlock(it.src->dtype, b.bytes.data() + b.skip, s.rows, it.cols, it.qshape, o.bytes.data(),
                    scales.data() + s.row0 * it.qshape.scales_per_row(it.cols), scratch.data(), n_threads);
      pools_[0].Push(std::move(b.bytes));
      b = std::move(o);
    } else if (s.kind == Segment::kScales) {
      b.floats = std::move(scales);
      scales.clear();
    }
    if (!write_q_.Push(std::move(b))) return;
  }
}

void ShardPipeline::Write(DirectWriter* sink, Xxh128* hasher) {
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(p_.header.size() >> (8 * i));
  hasher->Update(std::as_bytes(std::span(len)));
  hasher->Update(std::as_bytes(std::span(p_.header.data(), p_.header.size())));
  sink->Append(reinterpret_cast<const std::byte*>(len), 8);
  sink->Append(reinterpret_cast<const std::byte*>(p_.header.data()), p_.header.size());
  Block b;
  while (write_q_.Pop(&b)) {
    if (b.seg == SIZE_MAX) {
      sink->Finish();
      return;
    }
    const Segment& s = segs_[b.seg];
    std::span<const std::byte> bytes = s.kind == Segment::kScales
                                           ? std::as_bytes(std::span(b.floats))
                                           : std::span<const std::byte>(b.bytes.data() + b.skip, s.dst_len);
    K3_CHECK(bytes.size() == s.dst_len);
    hasher->Update(bytes);
    sink->Append(bytes.data(), bytes.size());
    CrashPoint("repack-block-written");
    src_written_ += s.src_len;
    if (b.pool >= 0) pools_[b.pool].Push(std::move(b.bytes));
  }
}

void ShardPipeline::KeepBuffers() {
  for (int k = 0; k < 2; ++k) {
    AlignedBuffer b;
    while (pools_[k].TryPop(&b)) bufs_->blocks[k].push_back(std::move(b));
  }
}

void ShardPipeline::RunReaders(size_t n) {
  std::vector<std::thread> threads;
  Guard([&] {  // a thread that cannot start fails the pipeline; the started ones end
    for (size_t k = 1; k < n; ++k)
      threads.push_back(StartThread([this] { Guard([&] { ReadSegments(); }); }));
  });
  Guard([&] { ReadSegments(); });
  for (auto& t : threads) t.join();
}

void ShardPipeline::ReadSegments() {
  for (;;) {
    Block b;
    size_t i;
    {
      std::lock_guard<std::mutex> lock(claim_mu_);
      i = next_claim_;
      if (i > segs_.size()) return;
      ++next_claim_;
      claimed_ = next_claim_;
      if (i < segs_.size()) {
        b.seg = i;
        if (segs_[i].kind != Segment::kScales) {
          if (!pools_[0].Pop(&b.bytes)) return;
          b.pool = 0;
        }
      }
    }
    if (b.pool == 0) ReadSource(segs_[i], &b);
    if (!PutRead(i, std::move(b)) || i == segs_.size()) return;
  }
}

size_t ShardPipeline::ReserveBytes(const std::vector<Segment>& segs, uint64_t block_bytes, bool quantized) {
  uint64_t n = quantized ? block_bytes / 2 : block_bytes + 2 * AlignedBuffer::kAlign;
  for (const Segment& s : segs) {
    if (!quantized) n = std::max(n, s.src_len + 2 * AlignedBuffer::kAlign);
    if (quantized && s.kind == Segment::kQuant) n = std::max(n, s.dst_len);
  }
  return static_cast<size_t>(n);
}

void ShardPipeline::ReadSource(const Segment& s, Block* b) {
  if (read_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(read_delay_ms_));
  b->bytes.Reserve(reserve_[0]);
  if (use_direct_.load() &&
      !ReadDirect(direct_fd_.get(), &b->bytes, s.src_off, s.src_len, p_.src->path(), &b->skip)) {
    static const char kRefusedKey = 0;
    LogOnce(&kRefusedKey, LogLevel::kInfo,
            "%s: O_DIRECT refused by the filesystem; reading through the page cache",
            p_.src->path().c_str());
    use_direct_ = false;
  }
  if (!use_direct_.load()) {
    b->skip = 0;
    PreadFull(p_.src->fd(), std::span(b->bytes.data(), s.src_len), s.src_off, p_.src->path());
  }
}

bool ShardPipeline::PutRead(size_t i, Block b) {
  std::lock_guard<std::mutex> lock(ready_mu_);
  if (ready_closed_) return false;
  ready_.emplace(i, std::move(b));
  if (i == next_ready_) ready_cv_.notify_one();
  return true;
}

bool ShardPipeline::TakeRead(Block* b) {
  std::unique_lock<std::mutex> lock(ready_mu_);
  ready_cv_.wait(lock, [&] {
    return ready_closed_ || (!ready_.empty() && ready_.begin()->first == next_ready_);
  });
  if (ready_closed_) return false;
  *b = std::move(ready_.begin()->second);
  ready_.erase(ready_.begin());
  ++next_ready_;
  return true;
}

void ShardPipeline::Fail(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (!err_) err_ = e;
  }
  write_q_.Close();
  pools_[0].Close();
  pools_[1].Close();
  std::lock_guard<std::mutex> lock(ready_mu_);
  ready_closed_ = true;
  ready_cv_.notify_all();
}

}  // namespace k3::repack
