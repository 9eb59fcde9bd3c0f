// Python arguments to core specs for the bindings: the enum spellings, and
// the one place a LookupSpec or StringSpec is built. The CPU binding and the
// GPU ones share it, so both reject the same calls with the same ValueError.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "cc/core/lookup.h"
#include "cc/core/strings.h"

namespace tf_ctr_py {

inline ctr::Combiner ParseCombiner(const std::string& s) {
  if (s == "sum") return ctr::Combiner::kSum;
  if (s == "mean") return ctr::Combiner::kMean;
  if (s == "sqrtn") return ctr::Combiner::kSqrtn;
  throw pybind11::value_error("combiner must be 'sum', 'mean' or 'sqrtn', got '" + s + "'");
}

inline ctr::IdMode ParseIdMode(const std::string& s) {
  if (s == "index") return ctr::IdMode::kIndex;
  if (s == "hash") return ctr::IdMode::kHash;
  throw pybind11::value_error("id_mode must be 'index' or 'hash', got '" + s + "'");
}

inline ctr::InvalidIds ParseInvalidIds(const std::string& s) {
  if (s == "error") return ctr::InvalidIds::kError;
  if (s == "skip_negative") return ctr::InvalidIds::kSkipNegative;
  if (s == "skip_padding") return ctr::InvalidIds::kSkipPadding;
  throw pybind11::value_error("invalid_ids must be 'error', 'skip_negative' or 'skip_padding', got '" + s + "'");
}

inline ctr::TokenMode ParseTokenMode(const std::string& s) {
  if (s == "hash") return ctr::TokenMode::kHash;
  if (s == "index") return ctr::TokenMode::kIndex;
  if (s == "mod") return ctr::TokenMode::kMod;
  throw pybind11::value_error("id_mode must be 'hash', 'index' or 'mod', got '" + s + "'");
}

inline ctr::LookupSpec MakeLookupSpec(int64_t vocab, int64_t dim, const std::string& combiner,
                                     const std::string& id_mode, const std::string& invalid_ids,
                                     bool prune_weights, int64_t default_id, float max_norm) {
  if (vocab < 0 || dim < 0) throw pybind11::value_error("vocab and dim must be >= 0");
  ctr::LookupSpec spec;
  spec.vocab = vocab;
  spec.dim = dim;
  spec.combiner = ParseCombiner(combiner);
  spec.id_mode = ParseIdMode(id_mode);
  spec.invalid_ids = ParseInvalidIds(invalid_ids);
  spec.prune_weights = prune_weights;
  spec.default_id = default_id;
  spec.max_norm = max_norm;
  if (spec.id_mode == ctr::IdMode::kHash && vocab <= 0)
    throw pybind11::value_error("hash mode needs at least one bucket");
  if (default_id < -1 || default_id >= vocab) throw pybind11::value_error("default_id out of range");
  return spec;
}

inline ctr::StringSpec MakeStringSpec(int64_t vocab, int64_t dim, const std::string& combiner,
                                      const std::string& id_mode, const std::string& delimiter, bool skip_empty,
                                      float max_norm, int64_t default_id, int64_t num_buckets = 0,
                                      const std::string& invalid_ids = "error") {
  if (vocab < 0 || dim < 0) throw pybind11::value_error("vocab and dim must be >= 0");
  if (num_buckets < 0) throw pybind11::value_error("num_buckets must be >= 0");
  if (invalid_ids != "error" && invalid_ids != "skip_negative")
    throw pybind11::value_error("invalid_ids must be 'error' or 'skip_negative'");
  ctr::StringSpec s;
  s.lookup.vocab = vocab;
  s.lookup.dim = dim;
  s.lookup.combiner = ParseCombiner(combiner);
  s.lookup.max_norm = max_norm;
  s.lookup.default_id = default_id;
  s.mode = ParseTokenMode(id_mode);
  s.skip_empty = skip_empty;
  s.buckets = num_buckets;
  s.skip_negative = invalid_ids == "skip_negative";
  const std::string err = ctr::SetDelimiter(&s, delimiter);
  if (!err.empty()) throw pybind11::value_error(err);
  if (vocab <= 0 && s.mode != ctr::TokenMode::kIndex)
    throw pybind11::value_error("hash and mod modes need at least one table row");
  if (default_id < -1 || default_id >= vocab) throw pybind11::value_error("default_id out of range");
  return s;
}

}  // namespace tf_ctr_py
