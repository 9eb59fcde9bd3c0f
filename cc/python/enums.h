// String-to-enum parsing for the Python bindings (CPU and GPU share it).
#pragma once

#include <pybind11/pybind11.h>

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

}  // namespace tf_ctr_py
