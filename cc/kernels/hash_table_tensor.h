// What the CPU and GPU kernels of CtrHashTableFind share: their attributes,
// and the key table variable's tensor as they take it (its dtype, rank and
// shape), each read or checked in one place.
#pragma once

#include <string>

#include "cc/core/hash_table_cpu.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_ctr {

struct FindAttrs {
  ctr::InsertRules rules{};
  std::string eviction = "none";  // rules.eviction's name, for messages
  bool insert = false;
  bool new_step = true;
};

inline absl::Status ReadFindAttrs(tensorflow::OpKernelConstruction* c, FindAttrs* a) {
  TF_RETURN_IF_ERROR(c->GetAttr("capacity", &a->rules.capacity));
  TF_RETURN_IF_ERROR(c->GetAttr("admit_after", &a->rules.admit_after));
  TF_RETURN_IF_ERROR(c->GetAttr("dense_padding", &a->rules.dense_padding));
  TF_RETURN_IF_ERROR(c->GetAttr("eviction", &a->eviction));
  TF_RETURN_IF_ERROR(c->GetAttr("insert", &a->insert));
  TF_RETURN_IF_ERROR(c->GetAttr("new_step", &a->new_step));
  a->rules.eviction = ctr::ParseEviction(a->eviction);
  return absl::OkStatus();
}

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
