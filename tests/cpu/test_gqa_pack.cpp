// GQA packing for decode (src/core/gqa_pack.h): the rewritten call addresses the same elements.
#include <gtest/gtest.h>

#include "core/gqa_pack.h"

namespace {

flashcore_attention_params decode(int64_t b, int64_t hq, int64_t hkv, int64_t d, int causal, int bhsd) {
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.batch = b, p.seqlen_q = 1, p.seqlen_k = 4096, p.num_heads_q = hq, p.num_heads_kv = hkv, p.head_dim = d;
  p.dtype = FLASHCORE_DTYPE_BF16, p.causal = causal;
  EXPECT_EQ(flashcore_attention_params_set_contiguous(&p, bhsd), FLASHCORE_SUCCESS);
  return p;
}

int64_t offset(const flashcore_tensor_strides& s, int64_t b, int64_t row, int64_t h, int64_t d) {
  return b * s.batch + row * s.seq + h * s.head + d * s.dim;
}

TEST(GqaPack, OnlyDecodeWithSharedKvHeads) {
  EXPECT_TRUE(flashcore::core::gqa_packable(decode(2, 32, 8, 128, 0, 0)));
  EXPECT_FALSE(flashcore::core::gqa_packable(decode(2, 8, 8, 128, 0, 0)));  // MHA: nothing to share
  flashcore_attention_params p = decode(2, 32, 8, 128, 0, 0);
  p.seqlen_q = 2;
  EXPECT_FALSE(flashcore::core::gqa_packable(p));  // two query positions: rows of one head are not contiguous
}

TEST(GqaPack, SameElementsBothLayouts) {
  for (int bhsd : {0, 1}) {
    for (int causal : {0, 1}) {
      const flashcore_attention_params p = decode(3, 32, 8, 128, causal, bhsd);
      const flashcore_attention_params q = flashcore::core::gqa_packed(p);
      EXPECT_EQ(q.seqlen_q, 4);
      EXPECT_EQ(q.num_heads_q, 8);
      EXPECT_EQ(q.num_heads_kv, 8);
      EXPECT_EQ(q.causal, 0);  // one query row sees every key under bottom-right alignment
      EXPECT_EQ(q.seqlen_k, p.seqlen_k);
      for (int64_t b = 0; b < 3; ++b) {
        for (int64_t h = 0; h < 32; ++h) {
          const int64_t kvh = h / 4, g = h % 4;
          for (int64_t d : {int64_t{0}, int64_t{127}}) {
            EXPECT_EQ(offset(q.q_strides, b, g, kvh, d), offset(p.q_strides, b, 0, h, d)) << bhsd << " " << h;
            EXPECT_EQ(offset(q.o_strides, b, g, kvh, d), offset(p.o_strides, b, 0, h, d)) << bhsd << " " << h;
          }
          // LSE: (batch, heads, seqlen_q) contiguous in both forms.
          EXPECT_EQ((b * q.num_heads_q + kvh) * q.seqlen_q + g, (b * p.num_heads_q + h) * p.seqlen_q + 0);
        }
      }
    }
  }
}

}  // namespace
