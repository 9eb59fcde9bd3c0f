// Python arguments to core specs for the bindings: the enum spellings, and
// the one place a LookupSpec or StringSpec is built. The CPU binding and the
// GPU ones share it, so both reject the same calls with the same ValueError.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/hash_table_cpu.h"  // ParseEviction
#include "cc/core/lookup.h"
#include "cc/core/strings.h"

namespace tf_ctr_py {

// A core parser's message as the ValueError of the binding.
inline void Require(const std::string& error) {
  if (!error.empty()) throw pybind11::value_error(error);
}

inline ctr::InsertRules MakeInsertRules(int64_t capacity, int64_t admit_after, bool dense_padding,
                                       const std::string& eviction) {
  if (admit_after < 1) throw pybind11::value_error("admit_after must be >= 1");
  if (eviction != "none" && eviction != "lru" && eviction != "lfu")
    throw pybind11::value_error("eviction must be 'none', 'lru' or 'lfu', got '" + eviction + "'");
  return {capacity, admit_after, dense_padding, ctr::ParseEviction(eviction)};
}

inline ctr::LookupSpec MakeLookupSpec(int64_t vocab, int64_t dim, const std::string& combiner,
                                     const std::string& id_mode, const std::string& invalid_ids,
                                     bool prune_weights, int64_t default_id, float max_norm,
                                     const std::vector<int64_t>& hash_key = {}) {
  if (vocab < 0 || dim < 0) throw pybind11::value_error("vocab and dim must be >= 0");
  ctr::LookupSpec spec;
  spec.vocab = vocab;
  spec.dim = dim;
  Require(ctr::ParseCombiner(combiner, &spec.combiner));
  Require(ctr::ParseIdMode(id_mode, &spec.id_mode));
  Require(ctr::ParseInvalidIds(invalid_ids, &spec.invalid_ids));
  spec.prune_weights = prune_weights;
  spec.default_id = default_id;
  spec.max_norm = max_norm;
  Require(ctr::SetHashKey(hash_key, &spec.hash));
  if (spec.id_mode == ctr::IdMode::kHash && vocab <= 0)
    throw pybind11::value_error("hash mode needs at least one bucket");
  if (default_id < -1 || default_id >= vocab) throw pybind11::value_error("default_id out of range");
  return spec;
}

inline ctr::StringSpec MakeStringSpec(int64_t vocab, int64_t dim, const std::string& combiner,
                                      const std::string& id_mode, const std::string& delimiter, bool skip_empty,
                                      float max_norm, int64_t default_id, int64_t num_buckets = 0,
                                      const std::string& invalid_ids = "error",
                                      const std::vector<int64_t>& hash_key = {}) {
  if (vocab < 0 || dim < 0) throw pybind11::value_error("vocab and dim must be >= 0");
  if (num_buckets < 0) throw pybind11::value_error("num_buckets must be >= 0");
  if (invalid_ids != "error" && invalid_ids != "skip_negative")
    throw pybind11::value_error("invalid_ids must be 'error' or 'skip_negative'");
  ctr::StringSpec s;
  s.lookup.vocab = vocab;
  s.lookup.dim = dim;
  Require(ctr::ParseCombiner(combiner, &s.lookup.combiner));
  s.lookup.max_norm = max_norm;
  s.lookup.default_id = default_id;
  Require(ctr::ParseTokenMode(id_mode, &s.mode));
  s.skip_empty = skip_empty;
  s.buckets = num_buckets;
  s.skip_negative = invalid_ids == "skip_negative";
  Require(ctr::SetHashKey(hash_key, &s.lookup.hash));
  Require(ctr::SetDelimiter(&s, delimiter));
  if (vocab <= 0 && s.mode != ctr::TokenMode::kIndex)
    throw pybind11::value_error("hash and mod modes need at least one table row");
  if (default_id < -1 || default_id >= vocab) throw pybind11::value_error("default_id out of range");
  return s;
}

}  // namespace tf_ctr_py
