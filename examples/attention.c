/* FlashCore from C: query the library, then (on a GPU it supports) run one causal bf16 forward pass and check it.
 *
 * Q and K are zero, so every key a query may see gets the same weight and O[s] is the mean of V[0..s]: an
 * answer the host computes exactly. Without a GPU FlashCore supports (sm_90a: the Hopper kernels; sm_80 and newer:
 * the portable ones) it says so and exits 0.
 * Build: see examples/CMakeLists.txt (find_package(flashcore)). */
#include <cuda_runtime_api.h>
#include <flashcore/flashcore.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BATCH = 2, SEQ = 200, HEADS = 4 };

static uint16_t bf16_from_float(float f) { /* exact for the multiples of 0.5 used below */
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return (uint16_t)(bits >> 16);
}

static float float_from_bf16(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static float v_value(long s, long h, long d) { return 0.5f * (float)((s + 3 * h + d) % 5 - 2); }

static int cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fprintf(stderr, "attention_c: %s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

int main(void) {
  printf("attention_c: FlashCore %s (header %d.%d.%d)\n", flashcore_version_string(), FLASHCORE_VERSION_MAJOR,
         FLASHCORE_VERSION_MINOR, FLASHCORE_VERSION_PATCH);
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  if (flashcore_get_capabilities(&caps) != FLASHCORE_SUCCESS) {
    fprintf(stderr, "attention_c: capabilities: %s\n", flashcore_last_error());
    return 1;
  }
  if (!caps.device_supported) {
    printf("attention_c: no supported GPU found (device arch %d): nothing to run\n", caps.device_arch);
    return 0;
  }
  int has_bf16 = 0;
  for (int i = 0; i < caps.num_dtypes; ++i) has_bf16 |= caps.dtypes[i] == FLASHCORE_DTYPE_BF16;
  if (!has_bf16 || caps.num_head_dims < 1) {
    fprintf(stderr, "attention_c: this library was built without bf16 kernels\n");
    return 1;
  }
  const long dim = caps.head_dims[0];
  const size_t n = (size_t)BATCH * SEQ * HEADS * dim;
  uint16_t* host = malloc(n * sizeof *host);
  void *q = NULL, *k = NULL, *v = NULL, *o = NULL;
  int ok = host != NULL && cuda_ok(cudaMalloc(&q, n * 2), "cudaMalloc") && cuda_ok(cudaMalloc(&k, n * 2), "cudaMalloc") &&
           cuda_ok(cudaMalloc(&v, n * 2), "cudaMalloc") && cuda_ok(cudaMalloc(&o, n * 2), "cudaMalloc") &&
           cuda_ok(cudaMemset(q, 0, n * 2), "cudaMemset") && cuda_ok(cudaMemset(k, 0, n * 2), "cudaMemset");
  if (ok) { /* V in (batch, seq, heads, dim) order */
    size_t i = 0;
    for (long b = 0; b < BATCH; ++b)
      for (long s = 0; s < SEQ; ++s)
        for (long h = 0; h < HEADS; ++h)
          for (long d = 0; d < dim; ++d) host[i++] = bf16_from_float(v_value(s, h, d));
    ok = cuda_ok(cudaMemcpy(v, host, n * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  if (ok) {
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.q = q; p.k = k; p.v = v; p.o = o;
    p.batch = BATCH; p.seqlen_q = SEQ; p.seqlen_k = SEQ;
    p.num_heads_q = HEADS; p.num_heads_kv = HEADS; p.head_dim = dim;
    p.dtype = FLASHCORE_DTYPE_BF16;
    p.causal = 1;
    flashcore_attention_params_set_contiguous(&p, /*bhsd_layout=*/0);
    flashcore_status status = flashcore_attention_forward(&p, NULL);
    if (status != FLASHCORE_SUCCESS) {
      fprintf(stderr, "attention_c: %s: %s\n", flashcore_status_string(status), flashcore_last_error());
      ok = 0;
    }
  }
  ok = ok && cuda_ok(cudaMemcpy(host, o, n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  double max_err = 0.0;
  if (ok) {
    size_t i = 0;
    for (long b = 0; b < BATCH; ++b)
      for (long s = 0; s < SEQ; ++s)
        for (long h = 0; h < HEADS; ++h)
          for (long d = 0; d < dim; ++d) {
            double mean = 0.0;
            for (long j = 0; j <= s; ++j) mean += v_value(j, h, d);
            mean /= (double)(s + 1);
            max_err = fmax(max_err, fabs(float_from_bf16(host[i++]) - mean));
          }
    printf("attention_c: causal bf16 forward, batch %d, seqlen %d, heads %d, head dim %ld: max |O - expected| = %.4f\n",
           BATCH, SEQ, HEADS, dim, max_err);
    ok = max_err < 1e-2;
  }
  cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o);
  free(host);
  printf("attention_c: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
