/* A caller built against the 0.1 header (tests/abi/flashcore_v1.h), linked to the current library: it must
 * keep working. Without a GPU it checks the argument path (params_init / set_contiguous / validate,
 * get_capabilities) with fake device pointers; with a Hopper GPU it also runs a tiny forward pass and compares
 * it with a float computation on the host. Exit status 0: pass. C, not C++, on purpose. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "flashcore_v1.h"

static int g_failures = 0;

#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (!(cond)) {                                                \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                               \
      fputc('\n', stderr);                                        \
      ++g_failures;                                               \
    }                                                             \
  } while (0)

#define CANARY 0xC3
enum { CANARY_BYTES = 64 };

/* A 0.1 struct followed by canary bytes the library must never write. */
typedef struct {
  flashcore_attention_params p;
  unsigned char canary[CANARY_BYTES];
} guarded_params;

typedef struct {
  flashcore_capabilities caps;
  unsigned char canary[CANARY_BYTES];
} guarded_caps;

static int canary_intact(const unsigned char* canary) {
  for (int i = 0; i < CANARY_BYTES; ++i) {
    if (canary[i] != CANARY) return 0;
  }
  return 1;
}

/* Sizes of the problem: B=1, Sq=Sk=S, Hq=Hkv=H, head_dim from the capabilities. */
enum { B = 1, S = 16, H = 2 };

static void setup(guarded_params* g, flashcore_dtype dtype, int64_t head_dim, const void* q, const void* k,
                  const void* v, void* o, float* lse) {
  memset(g->canary, CANARY, sizeof(g->canary));
  flashcore_attention_params_init(&g->p);
  CHECK(canary_intact(g->canary), "flashcore_attention_params_init wrote past the 0.1 struct");
  CHECK(g->p.struct_size == sizeof(flashcore_attention_params), "struct_size = %u", g->p.struct_size);
  g->p.q = q, g->p.k = k, g->p.v = v, g->p.o = o, g->p.lse = lse;
  g->p.batch = B, g->p.seqlen_q = S, g->p.seqlen_k = S, g->p.num_heads_q = H, g->p.num_heads_kv = H;
  g->p.head_dim = head_dim;
  g->p.dtype = dtype;
  flashcore_status st = flashcore_attention_params_set_contiguous(&g->p, 0);
  CHECK(st == FLASHCORE_SUCCESS, "set_contiguous: %s: %s", flashcore_status_string(st), flashcore_last_error());
  CHECK(canary_intact(g->canary), "flashcore_attention_params_set_contiguous wrote past the 0.1 struct");
}

static float bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}
static uint16_t float_to_bf16(float f) { /* exact for the values used here (multiples of 1/64 below 2) */
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return (uint16_t)(u >> 16);
}

/* The tiny forward pass on a Hopper GPU (bf16 or fp16 are both 2 bytes; inputs are exact in both). */
static void run_on_gpu(flashcore_dtype dtype, int64_t D) {
  const size_t n = (size_t)B * S * H * D;
  uint16_t* host_q = malloc(n * 2);
  uint16_t* host_k = malloc(n * 2);
  uint16_t* host_v = malloc(n * 2);
  uint16_t* host_o = malloc(n * 2);
  float* host_lse = malloc((size_t)B * H * S * sizeof(float));
  float* fq = malloc(n * sizeof(float));
  float* fk = malloc(n * sizeof(float));
  float* fv = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) {
    /* small multiples of 1/64: exact in fp16 and bf16 */
    fq[i] = (float)((int)((i * 7) % 23) - 11) / 64.0f;
    fk[i] = (float)((int)((i * 5) % 19) - 9) / 64.0f;
    fv[i] = (float)((int)((i * 3) % 17) - 8) / 16.0f;
  }
  for (size_t i = 0; i < n; ++i) {
    if (dtype == FLASHCORE_DTYPE_BF16) {
      host_q[i] = float_to_bf16(fq[i]), host_k[i] = float_to_bf16(fk[i]), host_v[i] = float_to_bf16(fv[i]);
    } else { /* fp16: build the bits from the exact value m/64 or m/16 */
      const float* src[3] = {fq, fk, fv};
      uint16_t* dst[3] = {host_q, host_k, host_v};
      for (int t = 0; t < 3; ++t) {
        float x = src[t][i];
        uint16_t sign = x < 0 ? 0x8000u : 0;
        float a = fabsf(x);
        uint16_t bits = 0;
        if (a > 0) {
          int e = 0;
          float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
          bits = (uint16_t)(((e - 1 + 15) << 10) | (uint16_t)((m * 2.0f - 1.0f) * 1024.0f));
        }
        dst[t][i] = sign | bits;
      }
    }
  }
  void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL;
  float* dlse = NULL;
  CHECK(cudaMalloc(&dq, n * 2) == cudaSuccess, "cudaMalloc");
  CHECK(cudaMalloc(&dk, n * 2) == cudaSuccess, "cudaMalloc");
  CHECK(cudaMalloc(&dv, n * 2) == cudaSuccess, "cudaMalloc");
  CHECK(cudaMalloc(&dout, n * 2) == cudaSuccess, "cudaMalloc");
  CHECK(cudaMalloc((void**)&dlse, (size_t)B * H * S * sizeof(float)) == cudaSuccess, "cudaMalloc");
  if (g_failures == 0) {
    cudaMemcpy(dq, host_q, n * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dk, host_k, n * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, host_v, n * 2, cudaMemcpyHostToDevice);
    guarded_params g;
    setup(&g, dtype, D, dq, dk, dv, dout, dlse);
    flashcore_status st = flashcore_attention_forward(&g.p, NULL);
    CHECK(st == FLASHCORE_SUCCESS, "forward: %s: %s", flashcore_status_string(st), flashcore_last_error());
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
    cudaMemcpy(host_o, dout, n * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(host_lse, dlse, (size_t)B * H * S * sizeof(float), cudaMemcpyDeviceToHost);
    /* Host reference in float: (B, S, H, D) contiguous, scale 1/sqrt(D). */
    const float scale = 1.0f / sqrtf((float)D);
    double max_err = 0, max_lse_err = 0;
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < S; ++i) {
        float scores[S], mx = -INFINITY, sum = 0;
        for (int j = 0; j < S; ++j) {
          float dot = 0;
          for (int d = 0; d < D; ++d) dot += fq[((size_t)i * H + h) * D + d] * fk[((size_t)j * H + h) * D + d];
          scores[j] = dot * scale;
          if (scores[j] > mx) mx = scores[j];
        }
        for (int j = 0; j < S; ++j) sum += (scores[j] = expf(scores[j] - mx));
        for (int d = 0; d < D; ++d) {
          float acc = 0;
          for (int j = 0; j < S; ++j) acc += scores[j] * fv[((size_t)j * H + h) * D + d];
          const uint16_t bits = host_o[((size_t)i * H + h) * D + d];
          float got;
          if (dtype == FLASHCORE_DTYPE_BF16) {
            got = bf16_to_float(bits);
          } else {
            const int e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
            got = (e == 0 ? ldexpf((float)m, -24) : ldexpf(1.0f + (float)m / 1024.0f, e - 15)) *
                  ((bits & 0x8000u) ? -1.0f : 1.0f);
          }
          const double err = fabs((double)got - acc / sum);
          if (err > max_err) max_err = err;
        }
        const double lse_err = fabs((double)host_lse[(size_t)h * S + i] - (mx + logf(sum)));
        if (lse_err > max_lse_err) max_lse_err = lse_err;
      }
    }
    printf("GPU forward (0.1 caller): max |O - ref| = %.3g, max |LSE - ref| = %.3g\n", max_err, max_lse_err);
    CHECK(max_err < 2e-2, "O error %.3g", max_err);
    CHECK(max_lse_err < 1e-3, "LSE error %.3g", max_lse_err);
  }
  cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse);
  free(host_q), free(host_k), free(host_v), free(host_o), free(host_lse), free(fq), free(fk), free(fv);
}

int main(void) {
  /* ---- capabilities with the 0.1 struct size ---- */
  guarded_caps gc;
  memset(&gc, 0, sizeof(gc.caps));
  memset(gc.canary, CANARY, sizeof(gc.canary));
  gc.caps.struct_size = sizeof(flashcore_capabilities);
  flashcore_status st = flashcore_get_capabilities(&gc.caps);
  CHECK(st == FLASHCORE_SUCCESS, "get_capabilities: %s: %s", flashcore_status_string(st), flashcore_last_error());
  CHECK(canary_intact(gc.canary), "flashcore_get_capabilities wrote past the 0.1 struct (216 bytes)");
  CHECK(gc.caps.struct_size == 216, "struct_size = %u", gc.caps.struct_size);
  CHECK(gc.caps.num_dtypes >= 1 && gc.caps.num_head_dims >= 1, "no compiled kernel reported");
  {
    /* 90 (sm_90a) always; with the portable backend also its archs (80, 86, 89 by default), ascending. */
    int has90 = 0, sorted = 1;
    for (int i = 0; i < gc.caps.num_archs && i < FLASHCORE_MAX_CAPS; ++i) {
      has90 |= gc.caps.archs[i] == 90;
      if (i > 0 && gc.caps.archs[i] <= gc.caps.archs[i - 1]) sorted = 0;
    }
    CHECK(gc.caps.num_archs >= 1 && gc.caps.num_archs <= FLASHCORE_MAX_CAPS && has90 && sorted, "archs");
  }
  if (g_failures) return 1;
  const flashcore_dtype dtype = gc.caps.dtypes[0];
  const int64_t D = gc.caps.head_dims[0];
  int major = -1, minor = -1, patch = -1;
  flashcore_version(&major, &minor, &patch);
  printf("0.1 caller: library %s, dtype %d, head_dim %lld\n", flashcore_version_string(), (int)dtype, (long long)D);
  CHECK(major == FLASHCORE_VERSION_MAJOR, "major version %d", major);

  /* ---- argument path with fake 16-byte aligned device pointers (never dereferenced) ---- */
  const uintptr_t base = (uintptr_t)1 << 32, step = (uintptr_t)1 << 24;
  guarded_params g;
  setup(&g, dtype, D, (const void*)base, (const void*)(base + step), (const void*)(base + 2 * step),
        (void*)(base + 3 * step), (float*)(base + 4 * step));
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_SUCCESS, "validate: %s: %s", flashcore_status_string(st), flashcore_last_error());
  g.p.q_strides.seq = 12;
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_ERROR_INVALID_STRIDE, "bad stride gave %s", flashcore_status_string(st));
  CHECK(strstr(flashcore_last_error(), "q_strides") != NULL, "message '%s' does not name q_strides",
        flashcore_last_error());
  g.p.q_strides.seq = H * D;
  g.p.struct_size = 12;
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_ERROR_INVALID_ARGUMENT, "struct_size 12 gave %s", flashcore_status_string(st));
  CHECK(canary_intact(g.canary), "a call wrote past the 0.1 struct");

  /* ---- the GPU part ---- */
  int count = 0, device = 0, cc_major = 0, cc_minor = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      cc_major != 9 || cc_minor != 0) {
    (void)cudaGetLastError();
    printf("SKIPPED: no Hopper GPU (the forward pass of a 0.1 caller was not run)\n");
    /* Without a device forward must say so, not crash. */
    g.p.struct_size = sizeof(flashcore_attention_params);
    st = flashcore_attention_forward(&g.p, NULL);
    CHECK(st == FLASHCORE_ERROR_NO_DEVICE || st == FLASHCORE_ERROR_UNSUPPORTED_ARCH, "forward without a Hopper GPU: %s",
          flashcore_status_string(st));
  } else {
    run_on_gpu(dtype, D);
  }

  if (g_failures) {
    fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  printf("PASSED: 0.1 caller\n");
  return 0;
}
