// CUDA side of the string embedding (interface: cuda/string_launchers.h).
//
// Splitting rules (DelimiterAt, AcceptDelimiters, TokenStartAt: the split in
// 32-byte chunks that ForEachTokenChunked also does on the host), token
// resolution (ResolveToken: Fingerprint64 or ParseInt64), the combiner, the
// max_norm clip and its backward all come from cc/core, which the CPU kernels
// and their tests use too; this file only decides how that work is spread
// over a warp.
//
// One warp owns one bag:
//   1. Split: the warp reads 32 consecutive bytes, one per lane; each lane
//      tests whether a delimiter starts at its byte and a ballot turns that
//      into a mask, from which every lane derives the accepted delimiters
//      (non-overlapping, left to right) and, for its own one, the token it
//      ends. Only the current token start is carried to the next chunk, so a
//      bag of any length goes through with no per-bag buffer. A delimiter of
//      0 bytes makes whole strings the tokens, 32 strings per step.
//   2. Queue: tokens are packed into lanes, one per lane in bag order, until
//      32 are waiting. Short tokens would otherwise leave most lanes idle
//      while the few lanes holding a token hash or parse it.
//   3. Resolve: each lane hashes (out of line, see ResolveHashed) or parses
//      its token.
//   4. Accumulate: the warp splits into groups of 1..32 lanes (sized from
//      dim, like the lookup's lane groups); each group adds one token's row at
//      a time, its lanes splitting dim (16-byte loads when dim is a multiple
//      of 4 floats or 8 halves and the tables are aligned), several rows
//      loaded before the first is added (RowsInFlight). Group partials are
//      summed with shuffles at the end of the bag, in float32, then the
//      combiner applies.
//      Summation order therefore differs from the CPU's by rounding only.
//
// Errors: a bad token (not a number, or outside [0, V) in index mode) is never
// turned into an address. Its bag stops and records its row in d_status[0]
// with an atomicMin on the bit pattern: -1 read as unsigned is the largest
// value, so this both claims an untouched status and keeps the lowest bad row,
// which is the row the CPU reports whatever the scheduling. A one-warp kernel
// then, only if a row was recorded, splits that row again and fills begin,
// len, value and kind from its first bad token; a 5 x 64-bit record cannot be
// written atomically, and this keeps its fields from one token. For
// MultiStringEmbedding the recorded row is the string's index in
// string_splits, the lowest over all features: the caller maps it to its
// feature (the one whose strings hold it), that feature's row and vocab. Hash
// mode cannot fail, so the follow-up kernel is not launched for it.

#include "cuda/string_launchers.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cc/core/combiner.h"
#include "cc/core/float_types.h"
#include "cc/core/lookup.h"
#include "cc/core/strings.h"
#include "cuda/pooling_tiles.cuh"

namespace ctr {
namespace gpu {
namespace {

constexpr int kWarpsPerBlock = kBlockThreads / kWarpSize;
// Chunks of a string whose bytes are loaded together (one byte per lane each,
// packed in a 32-bit register).
constexpr int kChunksAhead = 4;

static_assert(kSplitChunk == kWarpSize, "a chunk is one byte per lane");

// ---------------------------------------------------------------------------
// Host helpers.

unsigned int BlocksForBags(int64_t bags) {
  const int64_t blocks = (bags + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned int>(std::min(std::max<int64_t>(blocks, 1), kMaxBlocks));
}

// What the kernels need of a spec to stay inside the table and the buffers;
// the CPU path assumes it, here a violation would fault the device.
std::string ValidateSpec(const StringSpec& s) {
  const LookupSpec& l = s.lookup;
  if (l.dim < 0) return "dim must be >= 0, got " + std::to_string(l.dim);
  if (l.vocab < 0) return "vocab must be >= 0, got " + std::to_string(l.vocab);
  // FloorMod and the hash divide by V.
  if (s.mode != TokenMode::kIndex && l.vocab <= 0)
    return "hash and mod modes need a table with at least one row, got " + std::to_string(l.vocab);
  if (s.delim_len < 0 || s.delim_len > kMaxDelimiterBytes)
    return "delimiter length must be in [0, " + std::to_string(kMaxDelimiterBytes) + "], got " +
           std::to_string(s.delim_len);
  if (l.default_id >= l.vocab)
    return "default_id " + std::to_string(l.default_id) + " is out of range [0, " +
           std::to_string(l.vocab) + ")";
  return "";
}

// Calls launch(vec, fragments) with both as compile-time constants; vec is
// VecWidth<T>() when vectorized, else 1.
template <typename T, typename Launch>
void ForTileShape(bool vectorize, int fragments, Launch&& launch) {
  auto with_vec = [&](auto vec) {
    switch (fragments) {
      case 1:
        launch(vec, std::integral_constant<int, 1>{});
        break;
      case 2:
        launch(vec, std::integral_constant<int, 2>{});
        break;
      default:
        launch(vec, std::integral_constant<int, kMaxFragments>{});
    }
  };
  if (vectorize) {
    with_vec(std::integral_constant<int, VecWidth<T>()>{});
  } else {
    with_vec(std::integral_constant<int, 1>{});
  }
}

// ---------------------------------------------------------------------------
// Device helpers.


__device__ __forceinline__ int64_t GlobalWarp() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
}

__device__ __forceinline__ int64_t GridWarps() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
}

__device__ __forceinline__ void RecordLowestRow(int64_t* d_status, int64_t row) {
  atomicMin(reinterpret_cast<unsigned long long*>(d_status), static_cast<unsigned long long>(row));
}

// ResolveToken's result: a table row (or kBadNumber / kBadKey) and the
// parsed number.
struct Resolved {
  int64_t row;
  int64_t value;
};

// The hash mode's ResolveToken, kept out of line on purpose: Fingerprint64's
// long-token path is large and register-hungry. Inlined, it was compiled into
// every kernel and resolve site (minutes of build per architecture) and set
// the register count, hence the occupancy, of the pooling loops around it.
// Called once per 32 tokens per lane, the call costs far less than the rows.
__device__ __noinline__ Resolved ResolveHashed(const uint8_t* tok, int64_t len, int64_t vocab, int64_t buckets,
                                               StringHash hash) {
  StringSpec s;
  s.lookup.vocab = vocab;
  s.lookup.hash = hash;
  s.buckets = buckets;
  s.mode = TokenMode::kHash;
  Resolved r{0, 0};
  r.row = ResolveToken(tok, len, s, &r.value);
  return r;
}

// ResolveToken, with the parse modes inline (they are short) and the hash out
// of line. The parse spec's mode is one of two constants, so its inlined hash
// branch folds away.
__device__ __forceinline__ Resolved Resolve(const StringSpec& s, const uint8_t* tok, int64_t len) {
  if (s.mode == TokenMode::kHash) return ResolveHashed(tok, len, s.lookup.vocab, s.buckets, s.lookup.hash);
  StringSpec p;
  p.lookup.vocab = s.lookup.vocab;
  p.skip_negative = s.skip_negative;
  p.mode = s.mode == TokenMode::kMod ? TokenMode::kMod : TokenMode::kIndex;
  Resolved r{0, 0};
  r.row = ResolveToken(tok, len, p, &r.value);
  return r;
}

// Up to 32 tokens of one bag, in bag order: lane l < count holds token l.
struct TokenSlots {
  int count = 0;      // warp-uniform
  int64_t begin = 0;  // absolute byte offset in the packed buffer
  int64_t len = 0;
};

// A warp's token queue: room for a full batch and the tokens of one more
// chunk (at most 32), in shared memory (2 x 32 x 16 bytes per warp).
struct QueueStorage {
  int64_t begin[2 * kWarpSize];
  int64_t len[2 * kWarpSize];
};

__device__ __forceinline__ QueueStorage& WarpQueue() {
  __shared__ QueueStorage queues[kWarpsPerBlock];
  return queues[threadIdx.x / kWarpSize];
}

// Packs tokens into TokenSlots and hands every full batch (and the last one)
// to flush(const TokenSlots&), which returns false to stop the bag.
// Warp-collective.
template <typename Flush>
struct TokenQueue {
  Flush& flush;
  QueueStorage& q;
  int count = 0;  // tokens waiting; warp-uniform

  // Appends the tokens of the lanes in `held`, lane order being bag order;
  // each of those lanes passes its own token as (begin, len). A token's slot
  // is the number waiting plus its rank among the holders, so each holder
  // stores its own: with shuffles, each slot's lane had to read its source
  // from a bit search (NthSetBit) of the holders, twice per chunk.
  __device__ bool Push(unsigned held, int64_t begin, int64_t len) {
    if (held == 0) return true;
    const int lane = Lane();
    if ((held >> lane) & 1u) {
      const int slot = count + BitCount(held & BitsBelow(lane));
      q.begin[slot] = begin;
      q.len[slot] = len;
    }
    count += BitCount(held);
    if (count < kWarpSize) return true;
    __syncwarp();
    TokenSlots t;
    t.count = kWarpSize;
    t.begin = q.begin[lane];
    t.len = q.len[lane];
    // The rest, fewer than 32, move to the front: lane l moves slot 32 + l
    // to slot l, which only it has read.
    const int rest = count - kWarpSize;
    if (lane < rest) {
      q.begin[lane] = q.begin[kWarpSize + lane];
      q.len[lane] = q.len[kWarpSize + lane];
    }
    count = rest;
    return FlushBatch(t);
  }

  __device__ bool Drain() {
    if (count == 0) return true;
    __syncwarp();
    TokenSlots t;
    t.count = count;
    const int lane = Lane();
    if (lane < count) {
      t.begin = q.begin[lane];
      t.len = q.len[lane];
    }
    count = 0;
    return FlushBatch(t);
  }

 private:
  // Slots read by one lane above are the next pushes' to write by another.
  __device__ bool FlushBatch(const TokenSlots& t) {
    const bool go_on = flush(t);
    __syncwarp();
    return go_on;
  }
};

// Calls flush with the tokens of bag `bag`, in split order (left to right), in batches
// of up to 32. Returns false when flush stopped the bag. Warp-collective.
template <typename Flush>
__device__ bool VisitBagTokens(const StringSpec& s, const uint8_t* bytes,
                               const int64_t* string_splits, const int64_t* bag_splits,
                               int64_t bag, Flush& flush) {
  int64_t first, last;
  BagStrings(bag_splits, bag, &first, &last);
  TokenQueue<Flush> queue{flush, WarpQueue()};
  const int lane = Lane();
  const int64_t dl = s.delim_len;
  if (dl == 0) {
    for (int64_t base = first; base < last; base += kWarpSize) {
      const int64_t j = base + lane;
      int64_t b = 0, n = 0;
      if (j < last) {
        b = string_splits[j];
        n = string_splits[j + 1] - b;
      }
      const bool keep = j < last && !(s.skip_empty && n == 0);
      if (!queue.Push(__ballot_sync(kFullMask, keep), b, n)) return false;
    }
    return queue.Drain();
  }
  for (int64_t j = first; j < last; ++j) {
    const int64_t str_begin = string_splits[j];
    const int64_t len = string_splits[j + 1] - str_begin;
    const uint8_t* str = bytes + str_begin;
    int64_t token_start = 0;
    // A delimiter must fit before the end, so chunks past len - dl hold none.
    // Each lane loads its byte of the next kChunksAhead chunks before the
    // first is split, so their memory round trips overlap: one chunk at a
    // time, splitting was bound by a round trip per 32 bytes. The bytes stay
    // packed in one register; a longer delimiter's other bytes are read
    // where the loads just brought them (L1).
    for (int64_t group = 0; group + dl <= len; group += kChunksAhead * kWarpSize) {
      uint32_t ahead = 0;
#pragma unroll
      for (int k = 0; k < kChunksAhead; ++k) {
        const int64_t i = group + k * kWarpSize + lane;
        if (i < len) ahead |= static_cast<uint32_t>(__ldg(str + i)) << (8 * k);
      }
#pragma unroll 1
      for (int k = 0; k < kChunksAhead; ++k) {
        const int64_t c = group + k * kWarpSize;
        if (c + dl > len) break;
        const int64_t i = c + lane;
        const uint8_t byte = static_cast<uint8_t>(ahead >> (8 * k));
        const bool candidate =
            i + dl <= len && (dl == 1 ? byte == s.delim[0] : DelimiterAt(str, i, s.delim, dl));
        const uint32_t accepted =
            AcceptDelimiters(__ballot_sync(kFullMask, candidate), c, dl, token_start);
        const bool ends_token = (accepted >> lane) & 1u;
        const int64_t start = ends_token ? TokenStartAt(accepted, lane, c, dl, token_start) : i;
        const bool keep = ends_token && !(s.skip_empty && start == i);
        token_start = NextTokenStart(accepted, c, dl, token_start);
        if (!queue.Push(__ballot_sync(kFullMask, keep), str_begin + start, i - start)) return false;
      }
    }
    // The token after the last delimiter; every lane holds the same one.
    const bool keep_last = !(s.skip_empty && token_start == len);
    if (keep_last && !queue.Push(1u, str_begin + token_start, len - token_start)) return false;
  }
  return queue.Drain();
}

// Resolves each lane's token of a batch; returns the lanes whose token is a
// table row. Lanes past the batch, and tokens dropped as kSkipKey, are in
// neither set.
__device__ __forceinline__ unsigned ResolveSlots(const StringSpec& s, const uint8_t* bytes,
                                                 const TokenSlots& t, int64_t* row,
                                                 int64_t* value, unsigned* bad) {
  const bool holds = Lane() < t.count;
  Resolved r{kSkipKey, 0};
  if (holds) r = Resolve(s, bytes + t.begin, t.len);
  *row = r.row;
  *value = r.value;
  *bad = __ballot_sync(kFullMask, holds && *row < 0 && *row != kSkipKey);
  return __ballot_sync(kFullMask, holds && *row >= 0);
}

// Pools bag `bag` into out_row. On a bad token it records the bag in
// d_status and returns without writing: the op fails, and the CPU also stops
// there. The bag index is also the error row (MultiStringEmbedding passes
// its global row f * batch + r). Warp-collective.
template <typename Tile, typename T>
__device__ void PoolBag(const StringSpec& s, const T* params, const uint8_t* bytes,
                        const int64_t* string_splits, const int64_t* bag_splits, int64_t bag,
                        const RowGroup& g, T* out_row, int64_t* d_status) {
  const int64_t dim = s.lookup.dim;
  constexpr int kRows = RowsInFlight<Tile::kFragmentCount>();
  // do/while: a bag is split at least once even when dim == 0, so bad tokens
  // are still reported for an empty embedding, as on the CPU.
  int64_t tile = 0;
  do {
    Tile acc;
    acc.Zero();
    int64_t kept_tokens = 0;  // every token weighs 1: BagWeights::Units at the end
    auto flush = [&](const TokenSlots& t) {
      int64_t row, value;
      unsigned bad;
      const unsigned kept = ResolveSlots(s, bytes, t, &row, &value, &bad);
      if (bad != 0) {
        if (Lane() == 0) RecordLowestRow(d_status, bag);
        return false;
      }
      // Round by round, group k takes the kept tokens of rank base + k,
      // base + k + groups, ... (kRows of them, loaded together; with nothing
      // skipped, the rank is the token); a group's row address only ever
      // comes from a token that resolved to a row.
      const int n = BitCount(kept);
      for (int base = 0; base < n; base += kRows * g.count) {
        const T* rows[kRows];
        float f[kRows];
#pragma unroll
        for (int u = 0; u < kRows; ++u) {
          const int k = base + u * g.count + g.index;
          const int64_t mine = ShuffleInt64(row, k < n ? KthSetLane(kept, k) : 0);
          rows[u] = k < n ? params + mine * dim : nullptr;
          f[u] = 1.f;
        }
        AddRows(rows, f, dim, s.lookup.max_norm, tile, g, &acc);
      }
      kept_tokens += n;
      return true;
    };
    if (!VisitBagTokens(s, bytes, string_splits, bag_splits, bag, flush)) return;
    const bool any = kept_tokens > 0;
    BagWeights bw = BagWeights::Units(kept_tokens);
    SumAcrossGroups(g, &acc);
    if (!any && s.lookup.default_id >= 0) {
      // Every group holds the whole sum now, so each may add the default row.
      AddRow(params + s.lookup.default_id * dim, 1.f, dim, s.lookup.max_norm, tile, g, &acc);
      bw.Add(1.f);
    }
    if (g.index == 0 && out_row != nullptr) acc.Store(out_row, dim, tile, g, OutputScale(s.lookup.combiner, bw, /*weighted=*/false),
                                CombinerDivisor(s.lookup.combiner, bw));
    tile += Tile::Width(g);
  } while (tile < dim);
}

// Fills d_status[1..4] from the first bad token of bag `bag` (its row is
// already in d_status[0]). Warp-collective.
__device__ void FillTokenError(const StringSpec& s, const uint8_t* bytes,
                               const int64_t* string_splits, const int64_t* bag_splits,
                               int64_t bag, int64_t* d_status) {
  auto flush = [&](const TokenSlots& t) {
    int64_t row, value;
    unsigned bad;
    ResolveSlots(s, bytes, t, &row, &value, &bad);
    if (bad == 0) return true;
    // Slots are in bag order, so the lowest bad lane is the CPU's token.
    if (Lane() == LowestSetBit(bad)) {
      d_status[1] = t.begin;
      d_status[2] = t.len;
      d_status[3] = value;
      d_status[4] = row;
    }
    return false;
  };
  VisitBagTokens(s, bytes, string_splits, bag_splits, bag, flush);
}

// dst = ClipBackward(row, grad_row) * scale, one gradient row. Group-collective.
template <typename T>
__device__ void WriteTokenGradRow(const StringSpec& s, const T* row, const T* grad_row,
                                  float scale, T* dst, const RowGroup& g) {
  const RowDots dots = s.lookup.max_norm > 0.f ? ComputeRowDots(row, grad_row, s.lookup.dim, g) : RowDots{};
  WriteClipBackward(s.lookup, row, grad_row, dots, scale, dst, g);
}

// Gradient rows of bag `bag`, as BagGradCpu with weights 1: one pass counts
// the bag's tokens (the combiner needs them all), a second writes one row per
// token at grad_offsets[bag] + its rank. Bad tokens are skipped, as the CPU's
// visitor without an error slot does. Warp-collective.
template <typename T>
__device__ void GradBag(const StringSpec& s, const T* params, const uint8_t* bytes,
                        const int64_t* string_splits, const int64_t* bag_splits, int64_t bag,
                        const T* grad_out, const int64_t* grad_offsets, const RowGroup& g,
                        T* grad_values, int64_t* grad_indices) {
  const int64_t dim = s.lookup.dim;
  const T* grad_row = grad_out + bag * dim;
  int64_t kept_tokens = 0;
  auto count = [&](const TokenSlots& t) {
    int64_t row, value;
    unsigned bad;
    kept_tokens += BitCount(ResolveSlots(s, bytes, t, &row, &value, &bad));
    return true;
  };
  VisitBagTokens(s, bytes, string_splits, bag_splits, bag, count);
  const bool any = kept_tokens > 0;
  const BagWeights bw = BagWeights::Units(kept_tokens);

  int64_t next = grad_offsets[bag];
  if (!any) {
    // The default row's gradient, or the zero row TF's safe lookup lists for
    // the id it fills an empty bag with (EmptyBagGradRow, as on the CPU).
    const EmptyBagGrad empty = EmptyBagGradRow(s.lookup);
    if (empty.row >= 0 && g.index == 0) {
      if (empty.zeros) {
        for (int64_t d = g.rank; d < dim; d += g.lanes) grad_values[next * dim + d] = FromAcc<T>(0.f);
      } else {
        WriteTokenGradRow(s, params + empty.row * dim, grad_row, 1.f, grad_values + next * dim, g);
      }
      if (g.rank == 0) grad_indices[next] = empty.row;
    }
    return;
  }
  const float scale = CombinerScale(s.lookup.combiner, bw);
  auto write = [&](const TokenSlots& t) {
    int64_t row, value;
    unsigned bad;
    const unsigned kept = ResolveSlots(s, bytes, t, &row, &value, &bad);
    const int n = BitCount(kept);
    for (int base = 0; base < n; base += g.count) {
      const int q = base + g.index;  // this group's token, by rank among the kept
      const int64_t mine = ShuffleInt64(row, q < n ? KthSetLane(kept, q) : 0);
      if (q >= n) continue;
      WriteTokenGradRow(s, params + mine * dim, grad_row, scale, grad_values + (next + q) * dim, g);
      if (g.rank == 0) grad_indices[next + q] = mine;
    }
    next += n;
    return true;
  };
  VisitBagTokens(s, bytes, string_splits, bag_splits, bag, write);
}

// ---------------------------------------------------------------------------
// Kernels. One warp per bag, grid-stride over bags.

__global__ void InitTokenStatusKernel(int64_t* d_status) {
  if (threadIdx.x < kTokenStatusSize) d_status[threadIdx.x] = threadIdx.x == 0 ? -1 : 0;
}

__global__ void CaptureTokenBytesKernel(const int64_t* d_status, const uint8_t* bytes, int64_t max_bytes,
                                       uint8_t* out) {
  if (d_status[0] < 0) return;
  const int64_t n = d_status[2] < max_bytes ? d_status[2] : max_bytes;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = bytes[d_status[1] + i];
}

template <int kVec, int kFragments, typename T>
__global__ void __launch_bounds__(kBlockThreads, CTR_STRING_MIN_BLOCKS)
    PoolStringsKernel(const StringSpec s, const T* __restrict__ params,
                      const uint8_t* __restrict__ bytes, const int64_t* __restrict__ string_splits,
                      const int64_t* __restrict__ bag_splits, int64_t num_bags, int lanes,
                      T* __restrict__ out, int64_t* d_status) {
  const RowGroup g = RowGroup::Make(lanes);
  for (int64_t r = GlobalWarp(); r < num_bags; r += GridWarps())
    PoolBag<LaneTile<kVec, kFragments>>(s, params, bytes, string_splits, bag_splits, r, g,
                                        out + r * s.lookup.dim, d_status);
}

// The tile shape is the widest any feature needs.
template <int kVec, int kFragments, typename T>
__global__ void __launch_bounds__(kBlockThreads, CTR_STRING_MIN_BLOCKS)
    MultiPoolStringsKernel(const FeatureDesc* __restrict__ features, int64_t num_rows,
                           int64_t batch, const uint8_t* __restrict__ bytes,
                           const int64_t* __restrict__ string_splits, int64_t* d_status) {
  for (int64_t row = GlobalWarp(); row < num_rows; row += GridWarps()) {
    const int64_t f = row / batch;
    // Read in place rather than copied: the spec's fields are then reloaded
    // from cache when needed instead of pinning ~30 registers for the bag.
    const FeatureDesc& desc = features[f];
    const int64_t r = row - f * batch;
    if (r >= desc.num_strings) continue;
    const RowGroup g = RowGroup::Make(RowGroupLanes(desc.spec.lookup.dim, kVec));
    // Bags are single strings: the bag is the string's index.
    T* out_row = r < desc.out_rows ? static_cast<T*>(desc.out) + r * desc.out_stride : nullptr;
    PoolBag<LaneTile<kVec, kFragments>>(desc.spec, static_cast<const T*>(desc.params), bytes,
                                        string_splits, nullptr, desc.first_string + r, g, out_row, d_status);
  }
}

// One warp. Does nothing unless a row of this launch was recorded.
__global__ void FillTokenErrorKernel(const StringSpec spec, const uint8_t* bytes,
                                     const int64_t* string_splits, const int64_t* bag_splits,
                                     int64_t num_bags, int64_t* d_status) {
  const int64_t r = d_status[0];
  if (r < 0 || r >= num_bags) return;
  FillTokenError(spec, bytes, string_splits, bag_splits, r, d_status);
}

__global__ void FillMultiTokenErrorKernel(const FeatureDesc* features, int64_t num_features,
                                          const uint8_t* bytes, const int64_t* string_splits,
                                          int64_t* d_status) {
  const int64_t string = d_status[0];
  if (string < 0) return;
  for (int64_t f = 0; f < num_features; ++f) {
    const FeatureDesc& d = features[f];
    if (string >= d.first_string && string < d.first_string + d.num_strings) {
      FillTokenError(d.spec, bytes, string_splits, nullptr, string, d_status);
      return;
    }
  }
}

__global__ void __launch_bounds__(kBlockThreads)
    StringGradRowCountsKernel(const StringSpec s, const uint8_t* __restrict__ bytes,
                              const int64_t* __restrict__ string_splits,
                              const int64_t* __restrict__ bag_splits, int64_t num_bags,
                              int64_t* __restrict__ counts, int64_t* d_status) {
  for (int64_t r = GlobalWarp(); r < num_bags; r += GridWarps()) {
    int64_t n = 0;
    auto count = [&](const TokenSlots& t) {
      int64_t row, value;
      unsigned bad;
      n += BitCount(ResolveSlots(s, bytes, t, &row, &value, &bad));
      if (bad != 0 && d_status != nullptr && Lane() == 0) RecordLowestRow(d_status, r);
      return true;
    };
    VisitBagTokens(s, bytes, string_splits, bag_splits, r, count);
    if (n == 0 && EmptyBagGradRow(s.lookup).row >= 0) n = 1;
    if (Lane() == 0) counts[r] = n;
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlockThreads)
    StringGradKernel(const StringSpec s, const T* __restrict__ params,
                     const uint8_t* __restrict__ bytes, const int64_t* __restrict__ string_splits,
                     const int64_t* __restrict__ bag_splits, int64_t num_bags,
                     const T* __restrict__ grad_out, const int64_t* __restrict__ grad_offsets,
                     int lanes, T* __restrict__ grad_values, int64_t* __restrict__ grad_indices) {
  const RowGroup g = RowGroup::Make(lanes);
  for (int64_t r = GlobalWarp(); r < num_bags; r += GridWarps())
    GradBag(s, params, bytes, string_splits, bag_splits, r, grad_out, grad_offsets, g,
            grad_values, grad_indices);
}

std::string CheckBags(int64_t num_bags) {
  return num_bags < 0 ? "num_bags must be >= 0, got " + std::to_string(num_bags) : "";
}

}  // namespace

// ---------------------------------------------------------------------------
// Launchers.

std::string InitTokenStatus(int64_t* d_status, void* stream) {
  InitTokenStatusKernel<<<1, kTokenStatusSize, 0, AsStream(stream)>>>(d_status);
  return CheckLaunch("InitTokenStatusKernel");
}

std::string CaptureTokenBytes(const int64_t* d_status, const uint8_t* bytes, int64_t max_bytes, uint8_t* d_out,
                              void* stream) {
  if (max_bytes <= 0) return "";
  CaptureTokenBytesKernel<<<1, kWarpSize, 0, AsStream(stream)>>>(d_status, bytes, max_bytes, d_out);
  return CheckLaunch("CaptureTokenBytesKernel");
}

std::string ReadTokenStatus(const int64_t* d_status, const uint8_t* bytes, int64_t max_bytes, int64_t* h_status,
                            uint8_t* h_bytes, void* stream) {
  const cudaStream_t st = AsStream(stream);
  uint8_t* shown = nullptr;
  std::string err = CudaError("cudaMallocAsync", cudaMallocAsync(&shown, max_bytes > 0 ? max_bytes : 1, st));
  if (!err.empty()) return err;
  err = CaptureTokenBytes(d_status, bytes, max_bytes, shown, stream);
  if (err.empty())
    err = CudaError("cudaMemcpyAsync", cudaMemcpyAsync(h_status, d_status, kTokenStatusSize * sizeof(int64_t),
                                                       cudaMemcpyDeviceToHost, st));
  if (err.empty() && max_bytes > 0)
    err = CudaError("cudaMemcpyAsync", cudaMemcpyAsync(h_bytes, shown, max_bytes, cudaMemcpyDeviceToHost, st));
  cudaFreeAsync(shown, st);
  if (err.empty()) err = CudaError("cudaStreamSynchronize", cudaStreamSynchronize(st));
  return err;
}

template <typename T>
std::string StringEmbedding(const StringSpec& spec, const T* params, const uint8_t* bytes,
                            const int64_t* string_splits, const int64_t* bag_splits,
                            int64_t num_bags, T* out, int64_t* d_status, void* stream) {
  std::string err = ValidateSpec(spec);
  if (err.empty()) err = CheckBags(num_bags);
  if (!err.empty() || num_bags == 0) return err;
  const cudaStream_t st = AsStream(stream);
  const int64_t dim = spec.lookup.dim;
  constexpr int kVec = VecWidth<T>();
  const bool vectorize = dim % kVec == 0 && IsVectorAligned(params) && IsVectorAligned(out);
  const int vec = vectorize ? kVec : 1;
  const int lanes = RowGroupLanes(dim, vec);
  ForTileShape<T>(vectorize, RowGroupFragments(dim, vec), [&](auto v, auto frags) {
    auto* kernel = PoolStringsKernel<decltype(v)::value, decltype(frags)::value, T>;
    kernel<<<OneWaveBlocks(kernel, num_bags, kWarpsPerBlock), kBlockThreads, 0, st>>>(
            spec, params, bytes, string_splits, bag_splits, num_bags, lanes, out, d_status);
  });
  err = CheckLaunch("PoolStringsKernel");
  if (!err.empty() || !CanHaveBadTokens(spec)) return err;
  FillTokenErrorKernel<<<1, kWarpSize, 0, st>>>(spec, bytes, string_splits, bag_splits, num_bags,
                                                d_status);
  return CheckLaunch("FillTokenErrorKernel");
}

template <typename T>
std::string MultiStringEmbedding(const FeatureDesc* h_features, FeatureDesc* d_features,
                                 int64_t num_features, int64_t batch, const uint8_t* bytes,
                                 const int64_t* string_splits, int64_t* d_status, void* stream) {
  if (num_features < 0 || batch < 0)
    return "num_features and batch must be >= 0, got " + std::to_string(num_features) + " and " +
           std::to_string(batch);
  for (int64_t f = 0; f < num_features; ++f) {
    const FeatureDesc& d = h_features[f];
    if (d.first_string < 0 || d.num_strings < 0 || d.num_strings > batch || d.out_rows < 0 ||
        d.out_rows > d.num_strings || d.out_stride < d.spec.lookup.dim)
      return "feature " + std::to_string(f) + ": strings [" + std::to_string(d.first_string) + ", +" +
             std::to_string(d.num_strings) + "), " + std::to_string(d.out_rows) + " output rows of stride " +
             std::to_string(d.out_stride) + " do not fit a batch of " + std::to_string(batch) + " and dim " +
             std::to_string(d.spec.lookup.dim);
  }
  bool vectorize = true;
  bool can_fail = false;
  int fragments = 1;
  for (int64_t f = 0; f < num_features; ++f) {
    const FeatureDesc& d = h_features[f];
    const std::string err = ValidateSpec(d.spec);
    if (!err.empty()) return "feature " + std::to_string(f) + ": " + err;
    const int64_t dim = d.spec.lookup.dim;
    vectorize = vectorize && dim % VecWidth<T>() == 0 && d.out_stride % VecWidth<T>() == 0 &&
                IsVectorAligned(d.params) && IsVectorAligned(d.out);
    can_fail = can_fail || CanHaveBadTokens(d.spec);
  }
  const int64_t num_rows = num_features * batch;
  if (num_rows == 0) return "";
  const int vec = vectorize ? VecWidth<T>() : 1;
  for (int64_t f = 0; f < num_features; ++f)
    fragments = std::max(fragments, RowGroupFragments(h_features[f].spec.lookup.dim, vec));
  const cudaStream_t st = AsStream(stream);
  // From pageable memory this returns once h_features is staged, so the caller
  // may free it; from pinned memory it must outlive the copy.
  std::string err = CudaError(
      "MultiStringEmbedding: copying feature descriptors",
      cudaMemcpyAsync(d_features, h_features, static_cast<size_t>(num_features) * sizeof(FeatureDesc),
                      cudaMemcpyHostToDevice, st));
  if (!err.empty()) return err;
  ForTileShape<T>(vectorize, fragments, [&](auto v, auto frags) {
    auto* kernel = MultiPoolStringsKernel<decltype(v)::value, decltype(frags)::value, T>;
    kernel<<<OneWaveBlocks(kernel, num_rows, kWarpsPerBlock), kBlockThreads, 0, st>>>(
        d_features, num_rows, batch, bytes, string_splits, d_status);
  });
  err = CheckLaunch("MultiPoolStringsKernel");
  if (!err.empty() || !can_fail) return err;
  FillMultiTokenErrorKernel<<<1, kWarpSize, 0, st>>>(d_features, num_features, bytes, string_splits,
                                                     d_status);
  return CheckLaunch("FillMultiTokenErrorKernel");
}

std::string StringGradRowCounts(const StringSpec& spec, const uint8_t* bytes,
                                const int64_t* string_splits, const int64_t* bag_splits,
                                int64_t num_bags, int64_t* counts, int64_t* d_status, void* stream) {
  std::string err = ValidateSpec(spec);
  if (err.empty()) err = CheckBags(num_bags);
  if (!err.empty() || num_bags == 0) return err;
  const cudaStream_t st = AsStream(stream);
  StringGradRowCountsKernel<<<BlocksForBags(num_bags), kBlockThreads, 0, st>>>(
      spec, bytes, string_splits, bag_splits, num_bags, counts, d_status);
  err = CheckLaunch("StringGradRowCountsKernel");
  if (!err.empty() || d_status == nullptr || !CanHaveBadTokens(spec)) return err;
  FillTokenErrorKernel<<<1, kWarpSize, 0, st>>>(spec, bytes, string_splits, bag_splits, num_bags, d_status);
  return CheckLaunch("FillTokenErrorKernel");
}

template <typename T>
std::string StringGrad(const StringSpec& spec, const T* params, const uint8_t* bytes,
                       const int64_t* string_splits, const int64_t* bag_splits, int64_t num_bags,
                       const T* grad_out, const int64_t* grad_offsets, T* grad_values,
                       int64_t* grad_indices, void* stream) {
  std::string err = ValidateSpec(spec);
  if (err.empty()) err = CheckBags(num_bags);
  if (!err.empty() || num_bags == 0) return err;
  const int lanes = RowGroupLanes(spec.lookup.dim, 1);
  StringGradKernel<<<BlocksForBags(num_bags), kBlockThreads, 0, AsStream(stream)>>>(
      spec, params, bytes, string_splits, bag_splits, num_bags, grad_out, grad_offsets, lanes,
      grad_values, grad_indices);
  return CheckLaunch("StringGradKernel");
}

// ---------------------------------------------------------------------------
// Explicit instantiations.

template std::string StringEmbedding<float>(const StringSpec&, const float*, const uint8_t*,
                                            const int64_t*, const int64_t*, int64_t, float*,
                                            int64_t*, void*);
template std::string StringEmbedding<Half>(const StringSpec&, const Half*, const uint8_t*,
                                           const int64_t*, const int64_t*, int64_t, Half*,
                                           int64_t*, void*);
template std::string StringEmbedding<BFloat16>(const StringSpec&, const BFloat16*, const uint8_t*,
                                               const int64_t*, const int64_t*, int64_t, BFloat16*,
                                               int64_t*, void*);

template std::string MultiStringEmbedding<float>(const FeatureDesc*, FeatureDesc*, int64_t, int64_t,
                                                 const uint8_t*, const int64_t*, int64_t*, void*);
template std::string MultiStringEmbedding<Half>(const FeatureDesc*, FeatureDesc*, int64_t, int64_t,
                                                const uint8_t*, const int64_t*, int64_t*, void*);
template std::string MultiStringEmbedding<BFloat16>(const FeatureDesc*, FeatureDesc*, int64_t,
                                                    int64_t, const uint8_t*, const int64_t*,
                                                    int64_t*, void*);

template std::string StringGrad<float>(const StringSpec&, const float*, const uint8_t*,
                                       const int64_t*, const int64_t*, int64_t, const float*,
                                       const int64_t*, float*, int64_t*, void*);
template std::string StringGrad<Half>(const StringSpec&, const Half*, const uint8_t*,
                                      const int64_t*, const int64_t*, int64_t, const Half*,
                                      const int64_t*, Half*, int64_t*, void*);
template std::string StringGrad<BFloat16>(const StringSpec&, const BFloat16*, const uint8_t*,
                                          const int64_t*, const int64_t*, int64_t,
                                          const BFloat16*, const int64_t*, BFloat16*, int64_t*,
                                          void*);

}  // namespace gpu
}  // namespace ctr
