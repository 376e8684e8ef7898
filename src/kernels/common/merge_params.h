// Parameters of the merge kernel (merge.cuh) and the row copy kernel (copy_rows.cuh), visible to host code.
// Strides are in elements; tensors are (batch, seq, head, dim) with dim contiguous, LSE (batch, head, seq).
#pragma once
#include <cstdint>

namespace flashcore::kernels {

struct MergeParams {
  int64_t seqlen, heads, rows;  // rows = batch * seqlen * heads
  const void* o_part;           // NULL: nothing to fold in, only o_out is written from the state
  int64_t part_stride[3];       // batch, seq, head
  const float* lse_part;
  int64_t lse_part_stride[3];   // batch, head, seq
  float* o_acc;
  int64_t acc_stride[3];
  float* lse_acc;
  int64_t lse_acc_stride[3];
  void* o_out;                  // NULL: not written
  int64_t out_stride[3];
  int init;                     // 1: the state is not read; the part becomes it
};

struct CopyRowsParams {
  const unsigned char* src;
  unsigned char* dst;
  int64_t src_stride[3];  // bytes: batch, seq, head
  int64_t dst_stride[3];
  int64_t seqlen, heads, rows;  // rows = batch * seqlen * heads
  int row_units;                // 16-byte units per row
};

}  // namespace flashcore::kernels
