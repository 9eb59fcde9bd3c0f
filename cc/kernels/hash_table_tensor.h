// The key table variable's tensor as the CPU and GPU kernels of
// CtrHashTableFind take it: its dtype, rank and shape, checked in one place.
#pragma once

#include "cc/core/hash_table_cpu.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_ctr {

// The slot count of `table` for `capacity` rows (the layout of
// cc/core/hash_table.h), or an InvalidArgument naming what is wrong.
inline absl::Status HashTableSlots(const tensorflow::Tensor& table, int64_t capacity, int64_t* num_slots) {
  if (table.dtype() != tensorflow::DT_INT64 || table.dims() != 2) {
    return tensorflow::errors::InvalidArgument("table must be a 2-D int64 variable (tf_ctr_ops.HashTable builds "
                                               "it), got ", tensorflow::DataTypeString(table.dtype()), " ",
                                               table.shape().DebugString());
  }
  return CoreStatus(ctr::TableSlots(table.dim_size(0), table.dim_size(1), capacity, num_slots));
}

}  // namespace tf_ctr
