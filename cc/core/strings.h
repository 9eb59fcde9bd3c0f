// Strings of delimited ids ("12,7,993") pooled straight from packed bytes:
// split, parse or hash, look up and pool in one pass, with no token strings
// and no id tensor. Token splitting and resolution are host/device functions
// that the CUDA kernels share.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
#include <emmintrin.h>
#endif

#include "cc/core/fingerprint.h"
#include "cc/core/hd.h"
#include "cc/core/lookup.h"
#include "cc/core/parse.h"

namespace ctr {

enum class TokenMode : int32_t {
  kHash = 0,   // to_hash_bucket_fast(token, V)
  kIndex = 1,  // to_number(token, int64), must lie in [0, V)
  kMod = 2,    // to_number(token, int64) floor-mod V
};
inline constexpr EnumName<TokenMode> kTokenModeNames[] = {
    {"hash", TokenMode::kHash}, {"index", TokenMode::kIndex}, {"mod", TokenMode::kMod}};
inline std::string ParseTokenMode(const std::string& s, TokenMode* out) {
  return ParseEnum("id_mode", kTokenModeNames, s, out);
}

constexpr int64_t kMaxDelimiterBytes = 16;

// Held by value (the delimiter inline) so a CUDA kernel takes it as a plain
// parameter, with no device copy of the attribute.
struct StringSpec {
  LookupSpec lookup;  // vocab, dim, combiner, max_norm
  TokenMode mode = TokenMode::kHash;
  uint8_t delim[kMaxDelimiterBytes] = {};
  int64_t delim_len = 0;  // 0: the whole string is one token
  bool skip_empty = true;
  int64_t buckets = 0;  // hash mode: hash % buckets (0: the table rows); a
                        // bucket >= vocab is a bad token, as a Gather says
  bool skip_negative = false;  // index mode: a negative id is dropped, as
                               // safe_embedding_lookup_sparse prunes it
};

// Empty on success, else why the delimiter cannot be used.
inline std::string SetDelimiter(StringSpec* s, const std::string& delim) {
  if (static_cast<int64_t>(delim.size()) > kMaxDelimiterBytes)
    return "delimiter must be at most " + std::to_string(kMaxDelimiterBytes) + " bytes, got " +
           std::to_string(delim.size());
  for (size_t i = 0; i < delim.size(); ++i) s->delim[i] = static_cast<uint8_t>(delim[i]);
  s->delim_len = static_cast<int64_t>(delim.size());
  return "";
}

// ---------------------------------------------------------------------------
// Splitting, as tf.strings.split does it: on the full delimiter, left to
// right and non-overlapping; skip_empty drops empty tokens. Strings are cut
// into 32-byte chunks. On a GPU warp, lane l tests whether a delimiter starts
// at byte c + l (DelimiterAt) and a ballot gathers those candidates into a
// mask; on the host one SIMD compare gives it (ForEachTokenChunked). The
// functions below turn the mask into tokens. The only state carried between
// chunks is where the current token starts, which is also the first byte a
// delimiter may start at (matches are non-overlapping). They work on masks
// only, so the CPU and GPU split the same way and the CPU tests check both.

constexpr int kSplitChunk = 32;  // bytes per chunk: one per lane of a warp

CTR_HD int BitCount(uint32_t m) {
#if defined(__CUDA_ARCH__)
  return __popc(m);
#else
  return __builtin_popcount(m);
#endif
}
// Index of the lowest / highest set bit; m must not be 0.
CTR_HD int LowestSetBit(uint32_t m) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(m)) - 1;
#else
  return __builtin_ctz(m);
#endif
}
CTR_HD int HighestSetBit(uint32_t m) {
#if defined(__CUDA_ARCH__)
  return 31 - __clz(static_cast<int>(m));
#else
  return 31 - __builtin_clz(m);
#endif
}
// Bits [0, b) set; b may be anything from 0 up (>= 32: all bits).
CTR_HD uint32_t BitsBelow(int64_t b) {
  return b <= 0 ? 0u : b >= 32 ? 0xffffffffu : (1u << b) - 1u;
}
// Index of the n-th (0-based) set bit of m; m must have more than n set bits.
// A binary search on popcounts: a warp uses it to find which lane holds the
// n-th token, and every lane pays the same five steps.
CTR_HD int NthSetBit(uint32_t m, int n) {
  int pos = 0;
  for (int width = 16; width > 0; width /= 2) {
    const int low = BitCount(m & BitsBelow(width));
    if (n >= low) {
      n -= low;
      m >>= width;
      pos += width;
    }
  }
  return pos;
}

// Whether the full delimiter starts at s[i]; the caller guarantees
// i + delim_len <= the string's length. The constant trip count lets nvcc
// unroll it, so a delimiter held in a spec stays in registers instead of
// local memory.
CTR_HD bool DelimiterAt(const uint8_t* s, int64_t i, const uint8_t* delim, int64_t delim_len) {
  for (int k = 0; k < kMaxDelimiterBytes; ++k) {
    if (k >= delim_len) return true;
    if (s[i + k] != delim[k]) return false;
  }
  return true;
}

// The delimiters the split accepts in chunk [chunk_begin, chunk_begin + 32),
// given the candidates (bit l: DelimiterAt(c + l)) and the current token
// start. Left to right, a match is taken unless an accepted one covers it.
CTR_HD uint32_t AcceptDelimiters(uint32_t candidates, int64_t chunk_begin, int64_t delim_len,
                                 int64_t token_start) {
  // Matches overlapping the previous chunk's last delimiter are not matches.
  uint32_t left = candidates & ~BitsBelow(token_start - chunk_begin);
  if (delim_len == 1) return left;  // single bytes cannot overlap
  uint32_t accepted = 0;
  while (left != 0) {
    const int b = LowestSetBit(left);
    accepted |= 1u << b;
    left &= ~BitsBelow(b + delim_len);
  }
  return accepted;
}

// Start of the token ended by the accepted delimiter at bit b of the chunk.
CTR_HD int64_t TokenStartAt(uint32_t accepted, int b, int64_t chunk_begin, int64_t delim_len,
                            int64_t token_start) {
  const uint32_t before = accepted & BitsBelow(b);
  return before != 0 ? chunk_begin + HighestSetBit(before) + delim_len : token_start;
}

// The token start carried into the next chunk.
CTR_HD int64_t NextTokenStart(uint32_t accepted, int64_t chunk_begin, int64_t delim_len,
                              int64_t token_start) {
  return accepted != 0 ? chunk_begin + HighestSetBit(accepted) + delim_len : token_start;
}

#if !defined(__CUDA_ARCH__)
// Bit l: whether p[l] == d, for l in [0, 32); p[0, 32) must be readable.
inline uint32_t ByteMask32(const uint8_t* p, uint8_t d) {
#if defined(__SSE2__)
  const __m128i pattern = _mm_set1_epi8(static_cast<char>(d));
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
  return static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(lo, pattern))) |
         (static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(hi, pattern))) << 16);
#else
  uint32_t m = 0;
  for (int l = 0; l < 32; ++l) m |= static_cast<uint32_t>(p[l] == d) << l;
  return m;
#endif
}

// Calls fn(begin, len) for each token of s[0, len) (fn returns false to
// stop), on the host in 32-byte chunks as a GPU warp splits them: a
// delimiter mask per chunk (one SIMD compare instead of a branch per byte)
// turned into tokens by AcceptDelimiters, the function the warp uses. Token
// lengths are unpredictable, so a per-byte or per-word scan mispredicts a
// branch at nearly every token end; here the only data-dependent branch is
// one per token. s[0, readable) must be readable (readable >= len): chunks
// that would read past it are copied out first.
template <typename Fn>
inline void ForEachTokenChunked(const uint8_t* s, int64_t len, int64_t readable, const uint8_t* delim,
                                int64_t delim_len, bool skip_empty, Fn fn) {
  int64_t start = 0;
  for (int64_t c = 0; c + delim_len <= len; c += kSplitChunk) {
    const uint8_t* chunk = s + c;
    uint8_t tail[kSplitChunk] = {};
    if (c + kSplitChunk > readable) {
      memcpy(tail, s + c, len - c);
      chunk = tail;
    }
    // Delimiters must fit in the string; bytes past it are not compared.
    uint32_t candidates = ByteMask32(chunk, delim[0]) & BitsBelow(len - delim_len + 1 - c);
    if (delim_len > 1) {
      uint32_t full = 0;
      for (uint32_t left = candidates; left != 0; left &= left - 1) {
        const int b = LowestSetBit(left);
        if (DelimiterAt(s, c + b, delim, delim_len)) full |= 1u << b;
      }
      candidates = full;
    }
    for (uint32_t accepted = AcceptDelimiters(candidates, c, delim_len, start); accepted != 0;
         accepted &= accepted - 1) {
      const int64_t end = c + LowestSetBit(accepted);
      if (!(skip_empty && end == start) && !fn(start, end - start)) return;
      start = end + delim_len;
    }
  }
  if (!(skip_empty && len == start)) fn(start, len - start);
}
#endif

constexpr int64_t kBadNumber = -3;  // ResolveToken: not an int64 literal

// Whether a token can fail (kBadNumber or kBadKey): in the parse modes, and
// in hash mode when the buckets outnumber the table rows.
CTR_HD bool CanHaveBadTokens(const StringSpec& s) {
  return s.mode != TokenMode::kHash || s.buckets > s.lookup.vocab;
}

// The table row of a parsed id in index or mod mode: kSkipKey for a negative
// id under skip_negative, kBadKey outside [0, V) in index mode.
CTR_HD int64_t RowOfId(int64_t id, const StringSpec& s) {
  const int64_t V = s.lookup.vocab;
  if (s.mode == TokenMode::kMod) return FloorMod(id, V);
  if (id < 0 && s.skip_negative) return kSkipKey;
  return (id >= 0 && id < V) ? id : kBadKey;
}

// Table row of one token, kSkipKey (a negative id under skip_negative), or
// kBadNumber / kBadKey (parsed, outside [0, V)). *value receives the parsed
// number in index and mod modes.
CTR_HD_HOT int64_t ResolveToken(const uint8_t* tok, int64_t len, const StringSpec& s, int64_t* value) {
  if (s.mode == TokenMode::kHash) {
    const int64_t V = s.lookup.vocab;
    const int64_t b = HashBucket(s.lookup.hash, tok, static_cast<uint64_t>(len), s.buckets > 0 ? s.buckets : V);
    *value = b;
    return b < V ? b : kBadKey;
  }
  if (!ParseInt64(tok, len, value)) return kBadNumber;
  return RowOfId(*value, s);
}

#if !defined(__CUDA_ARCH__)
// Whether tok[0, n) is 1 to 8 plain digits, parsed from one 8-byte load
// (tok[0, 8) must be readable, past the token if need be), with *value set.
// Such a token cannot overflow, so it parses as ParseInt64 would; the split
// has already found its length, so no branch depends on where it ends (a
// byte loop mispredicted at nearly every token end).
inline bool ParsePlainDigits8(const uint8_t* tok, int64_t n, int64_t* value) {
  constexpr uint64_t kThrees = 0x3030303030303030ULL, kHighNibbles = 0xF0F0F0F0F0F0F0F0ULL;
  constexpr uint64_t kSixes = 0x0606060606060606ULL;
  if (static_cast<uint64_t>(n - 1) > 7) return false;
  uint64_t w;
  memcpy(&w, tok, 8);
  // The token's bytes to the top, '0's below: leading zeros.
  const int shift = static_cast<int>(8 * (8 - n));
  const uint64_t x = (w << shift) | (kThrees & ~(~0ULL << shift));
  // A byte is a digit iff its high nibble is 3 and adding 6 keeps it so.
  // Only a non-digit byte can carry into the next one, and it is caught
  // itself, so any non-digit leaves a bit set.
  if ((((x & kHighNibbles) ^ kThrees) | (((x + kSixes) & kHighNibbles) ^ kThrees)) != 0) return false;
  // Pairs, quads, eights: the lowest byte is the most significant digit.
  uint64_t v = x & 0x0F0F0F0F0F0F0F0FULL;
  v = (v * 10 + (v >> 8)) & 0x00FF00FF00FF00FFULL;
  v = (v * 100 + (v >> 16)) & 0x0000FFFF0000FFFFULL;
  v = (v * 10000 + (v >> 32)) & 0xFFFFFFFFULL;
  *value = static_cast<int64_t>(v);
  return true;
}

// ResolveToken on the host, for a token with readable bytes from its start:
// short plain ids parse in one load, anything else by the general rules, so
// the row and value are ResolveToken's either way.
inline int64_t ResolveTokenHost(const uint8_t* tok, int64_t len, int64_t readable, const StringSpec& s,
                                int64_t* value) {
  if (s.mode != TokenMode::kHash && readable >= 8 && ParsePlainDigits8(tok, len, value)) return RowOfId(*value, s);
  return ResolveToken(tok, len, s, value);
}

// The split followed by ResolveToken on each token of str[0, len), whose
// bytes str[0, readable) may be read: fn(begin, len, row, value), returning
// false to stop.
template <typename Fn>
inline void ForEachResolvedToken(const uint8_t* str, int64_t len, int64_t readable, const StringSpec& s,
                                 Fn fn) {
  auto resolve = [&](int64_t b, int64_t n) {
    int64_t value = 0;
    const int64_t row = ResolveTokenHost(str + b, n, readable - b, s, &value);
    return fn(b, n, row, value);
  };
  if (s.delim_len == 0) {  // the whole string is the one token
    if (!(s.skip_empty && len == 0)) resolve(0, len);
  } else {
    ForEachTokenChunked(str, len, readable, s.delim, s.delim_len, s.skip_empty, resolve);
  }
}
#endif

// The first rejected token: its bag, where its bytes are, and why.
struct TokenError {
  int64_t row = -1;
  int64_t begin = 0;  // absolute byte offset in the packed buffer
  int64_t len = 0;
  int64_t value = 0;
  int64_t kind = 0;   // kBadNumber or kBadKey
  bool found() const { return row >= 0; }
};

inline std::string EscapeBytes(const uint8_t* p, int64_t n, int64_t max_len = 64) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (int64_t i = 0; i < n && i < max_len; ++i) {
    const uint8_t c = p[i];
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (n > max_len) out += "...";
  return out;
}

inline std::string DescribeTokenError(const TokenError& e, const uint8_t* bytes, int64_t vocab) {
  const std::string tok = "token '" + EscapeBytes(bytes + e.begin, e.len) + "' in row " + std::to_string(e.row);
  if (e.kind == kBadNumber) return tok + " is not an int64 number (as tf.strings.to_number parses it)";
  return tok + " is id " + std::to_string(e.value) + ", out of range [0, " + std::to_string(vocab) + ")";
}

// The strings of bag r: strings [r, r+1) when bags are single strings, else
// [bag_splits[r], bag_splits[r+1]).
CTR_HD void BagStrings(const int64_t* bag_splits, int64_t r, int64_t* first, int64_t* last) {
  *first = bag_splits ? bag_splits[r] : r;
  *last = bag_splits ? bag_splits[r + 1] : r + 1;
}

}  // namespace ctr
