// Backs a large host table with transparent huge pages.
//
// An embedding lookup or a hash-table probe touches rows scattered over the
// whole table: with 4 KiB pages nearly every row of a table past a few MiB
// costs a TLB miss as well as its cache miss. Linux backs a range with 2 MiB
// pages only where asked (the usual "madvise" THP setting), and TF's
// allocator never asks. So the first CPU kernel to read a table of at least
// kMinHugePageBytes asks for its whole 2 MiB pages (MADV_HUGEPAGE), once per
// buffer, and one background thread copies the pages already there into
// huge ones (MADV_COLLAPSE, Linux 6.1+), off the kernels' threads: a find
// of Zipf keys in a 1M-key table took 20-40% less time so (one thread). Only pages inside the buffer
// are touched, and only their backing changes, never their contents, under
// concurrent reads and writes alike (the kernel's own background collapse
// works so on every process). Failures (an older kernel, THP off, no free
// huge pages) leave the table as it was. TF_CTR_OPS_HUGE_PAGES=0 turns it off.
#pragma once

#include <cstddef>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_ctr {

// Below this a table's pages fit the TLB's reach, and a huge page could
// also hold memory the allocator hands to others.
constexpr size_t kMinHugePageBytes = size_t{32} << 20;

// Asks for huge pages for [data, data + bytes): see above. No-op off Linux.
void AdviseHugePages(const void* data, size_t bytes);

// For a table a kernel reads: host memory only (a CPU kernel's input).
inline void AdviseHugePages(tensorflow::OpKernelContext* ctx, const tensorflow::Tensor& table) {
  if (ctx->device()->device_type() != tensorflow::DEVICE_CPU || !table.IsInitialized()) return;
  AdviseHugePages(table.tensor_data().data(), table.TotalBytes());
}

}  // namespace tf_ctr
