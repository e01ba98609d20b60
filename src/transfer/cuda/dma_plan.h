// Internal: the host-side plan of the `dma` backend (dma_engine.cc): contiguous pieces merged
// into runs, runs of equal width at a constant pitch grouped into strided copies (in rising or
// falling address order: pages come off the tiers' free lists in either), and K and V
// strided copies of a page joined into one depth-2 copy. Plain C++ (no CUDA), so that the
// merging rules are tested without a GPU (tests/transfer/dma_plan_test.cc).
//
// Thread safety: none; the engine plans under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvtier/transfer.h"

namespace kvtier::transfer::cuda {

// `height` rows of `width` bytes, `spitch` / `dpitch` apart; `depth` > 1: that many such
// blocks, the z-th at src + z * spitch * s_layer_height (dst likewise): a depth-2 copy carries K
// and V of one page when V lies a whole number of rows after K on both sides.
struct Copy2D {
  const std::byte* src;
  std::byte* dst;
  size_t width;
  size_t spitch;
  size_t dpitch;
  size_t height;
  size_t depth = 1;
  size_t s_layer_height = 0;  // rows between blocks (depth > 1), >= height
  size_t d_layer_height = 0;

  // Where block z (0 <= z < depth) starts on each side.
  const std::byte* BlockSrc(size_t z) const { return src + z * spitch * s_layer_height; }
  std::byte* BlockDst(size_t z) const { return dst + z * dpitch * d_layer_height; }
};

// How `count` single copies are split over cudaMemcpyBatchAsync calls. The copy engines start
// on a batch only once the call that submitted it has returned (in the H100 run of
// docs/perf-notes/sglang-kernels.md an idle-stream call's GPU time was its host time plus its
// copy time, for SGLang and kvtier alike), and the driver takes 0.8-1.8 us per copy: so the
// copies go out in pieces, the first of `first` copies (TransferEngineConfig::
// dma_first_batch_piece: the copy engines start early), each next one twice the one before up to
// max(2 x first, count / 16) copies (the copy engines keep busy while the next piece is
// submitted, and the last piece, whose copy nothing overlaps, stays short, without a call per
// few copies on long batches); a remainder of at most 1.5 pieces goes whole (a last piece holds
// more than first / 2 copies). Each more call costs the copy engines a few us too (the held rows
// of the H100 run at e4884d9), which is why a busy stream may take the whole batch at once
// (WholeBatch).
// The first piece where no config says otherwise: TransferEngineConfig's default, declared there.
inline constexpr size_t kFirstBatchPiece =
    static_cast<size_t>(TransferEngineConfig{}.dma_first_batch_piece);
class BatchPieces {
 public:
  // `first` >= 1 (0 counts as 1).
  explicit BatchPieces(size_t count, size_t first = kFirstBatchPiece)
      : left_(count), piece_(first < 1 ? 1 : first) {
    cap_ = count / 16 > 2 * piece_ ? count / 16 : 2 * piece_;
  }
  // All `count` copies in one call (DmaBatchSplit::kWhole).
  static BatchPieces Whole(size_t count) { return BatchPieces(count, count); }
  // Copies in the next call; 0 once every copy had its call.
  size_t Next() {
    const size_t n = 2 * left_ <= 3 * piece_ ? left_ : piece_;
    left_ -= n;
    piece_ = 2 * piece_ < cap_ ? 2 * piece_ : cap_;
    return n;
  }

 private:
  size_t left_;
  size_t piece_;
  size_t cap_ = 0;
};

// Whether a lane's single copies go in one batch call (BatchPieces::Whole) rather than growing
// pieces, under `split`, given whether the request's stream had work pending when the copies
// were submitted (`stream_busy`; only asked under kWholeWhenBusy). A busy stream cannot start
// the first piece early, so its pieces would only add calls.
inline bool WholeBatch(DmaBatchSplit split, bool stream_busy) {
  return split == DmaBatchSplit::kWhole || (split == DmaBatchSplit::kWholeWhenBusy && stream_busy);
}

// Run merging and 2D grouping (step 3 of dma_engine.cc's file comment). Owns no memory but the
// vectors it fills, which the engine keeps between calls.
class CopyPlanner {
 public:
  // `min_strided_rows`: groups of fewer equal-width runs go out as single copies.
  void Reset(size_t max_pitch, size_t min_strided_rows = 2) {
    max_pitch_ = max_pitch;
    min_strided_rows_ = min_strided_rows < 2 ? 2 : min_strided_rows;
    dsts_.clear();
    srcs_.clear();
    sizes_.clear();
    copies_2d_.clear();
    run_len_ = 0;
    group_height_ = 0;
  }

  // `alloc`: which allocation of its side a piece lies in (pieces of different allocations
  // never merge, even when adjacent in the address space).
  // A piece right after the run on both sides extends it; so does one right before it (pages
  // whose free-list order came out descending: the copy is the same bytes either way).
  void Add(const std::byte* src, std::byte* dst, int64_t n, int64_t alloc) {
    if (run_len_ > 0 && alloc == run_alloc_ && src == run_src_ + run_len_ &&
        dst == run_dst_ + run_len_) {
      run_len_ += n;
      return;
    }
    if (run_len_ > 0 && alloc == run_alloc_ && src + n == run_src_ && dst + n == run_dst_) {
      run_src_ = src;
      run_dst_ = dst;
      run_len_ += n;
      return;
    }
    FlushRun();
    run_src_ = src;
    run_dst_ = dst;
    run_len_ = n;
    run_alloc_ = alloc;
  }

  // One single copy as given: never merged with a neighbour nor grouped into a strided copy
  // (the pieces before it are flushed first, so the plan keeps the order of the calls).
  void AddSingle(const std::byte* src, std::byte* dst, size_t n) {
    FlushRun();
    FlushGroup();
    dsts_.push_back(dst);
    srcs_.push_back(src);
    sizes_.push_back(n);
  }

  void Finish() {
    FlushRun();
    FlushGroup();
  }

  // A strided copy planned whole (height >= 2, pitches >= width and < the device's max pitch,
  // within one allocation per side). With `merge_depth`, a copy of the same shape whose source
  // and destination lie a whole number (>= height) of rows after the previous copy's on both
  // sides becomes that copy's second block (V after K of the same page).
  void AddStrided(const Copy2D& c, bool merge_depth) {
    FlushRun();
    FlushGroup();
    if (merge_depth && !copies_2d_.empty()) {
      Copy2D& prev = copies_2d_.back();
      if (prev.depth == 1 && prev.width == c.width && prev.height == c.height &&
          prev.spitch == c.spitch && prev.dpitch == c.dpitch && c.src > prev.src &&
          c.dst > prev.dst) {
        const auto sd = static_cast<size_t>(c.src - prev.src);
        const auto dd = static_cast<size_t>(c.dst - prev.dst);
        if (sd % c.spitch == 0 && dd % c.dpitch == 0 && sd / c.spitch >= c.height &&
            dd / c.dpitch >= c.height) {
          prev.depth = 2;
          prev.s_layer_height = sd / c.spitch;
          prev.d_layer_height = dd / c.dpitch;
          return;
        }
      }
    }
    copies_2d_.push_back(c);
  }

  std::vector<void*>& dsts() { return dsts_; }
  std::vector<const void*>& srcs() { return srcs_; }
  std::vector<size_t>& sizes() { return sizes_; }
  const std::vector<Copy2D>& copies_2d() const { return copies_2d_; }

 private:
  // Groups runs of equal width whose rows follow at a constant pitch on both sides, rising or
  // falling (pages taken from a free list in descending order); a group's src / dst is always its
  // lowest row, so its copy has positive pitches either way.
  void FlushRun() {
    if (run_len_ == 0) return;
    const auto w = static_cast<size_t>(run_len_);
    run_len_ = 0;
    if (group_height_ > 0 && w == group_.width && run_alloc_ == group_alloc_) {
      if (group_height_ == 1) {
        const bool up = run_src_ > group_.src && run_dst_ > group_.dst;
        const bool down = run_src_ < group_.src && run_dst_ < group_.dst;
        if (up || down) {
          const auto sp = static_cast<size_t>(up ? run_src_ - group_.src : group_.src - run_src_);
          const auto dp = static_cast<size_t>(up ? run_dst_ - group_.dst : group_.dst - run_dst_);
          if (sp >= w && dp >= w && sp < max_pitch_ && dp < max_pitch_) {
            group_.spitch = sp;
            group_.dpitch = dp;
            if (down) {
              group_.src = run_src_;
              group_.dst = run_dst_;
            }
            group_falling_ = down;
            group_height_ = 2;
            return;
          }
        }
      } else if (!group_falling_ && run_src_ == group_.src + group_height_ * group_.spitch &&
                 run_dst_ == group_.dst + group_height_ * group_.dpitch) {
        ++group_height_;
        return;
      } else if (group_falling_ && run_src_ + group_.spitch == group_.src &&
                 run_dst_ + group_.dpitch == group_.dst) {
        group_.src = run_src_;
        group_.dst = run_dst_;
        ++group_height_;
        return;
      }
    }
    FlushGroup();
    group_ = Copy2D{run_src_, run_dst_, w, 0, 0, 0};
    group_alloc_ = run_alloc_;
    group_height_ = 1;
  }

  void FlushGroup() {
    if (group_height_ == 0) return;
    if (group_height_ < min_strided_rows_) {
      for (size_t i = 0; i < group_height_; ++i) {
        dsts_.push_back(group_.dst + i * group_.dpitch);
        srcs_.push_back(group_.src + i * group_.spitch);
        sizes_.push_back(group_.width);
      }
    } else {
      group_.height = group_height_;
      copies_2d_.push_back(group_);
    }
    group_height_ = 0;
  }

  size_t max_pitch_ = 0;
  size_t min_strided_rows_ = 2;
  const std::byte* run_src_ = nullptr;
  std::byte* run_dst_ = nullptr;
  int64_t run_len_ = 0;
  int64_t run_alloc_ = 0;
  Copy2D group_{};
  int64_t group_alloc_ = 0;
  size_t group_height_ = 0;
  bool group_falling_ = false;  // its rows came highest first
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
  std::vector<Copy2D> copies_2d_;
};

}  // namespace kvtier::transfer::cuda
