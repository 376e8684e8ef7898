/* A caller built against the 0.2 header (tests/abi/flashcore_v2.h), linked to the current library: it must keep
 * working. Its flashcore_attention_params is the 0.2 layout (FLASHCORE_ATTENTION_PARAMS_V2_SIZE = 448 bytes, no
 * descales, no precision), followed here by canary bytes that the library must neither write nor read (they would
 * be invalid descale pointers / precision / reserved2 values if it did). Without a GPU it checks the argument path
 * (params_init, set_contiguous, validate with the 0.2 fields, get_capabilities, the workspace query's no-device
 * answer) with fake device pointers; with a Hopper GPU it also runs small forward passes with a workspace from the
 * query, lse_capacity and seqused_k, and compares them with a float computation on the host. Exit status 0: pass.
 * C, not C++, on purpose. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "flashcore_v2.h"

/* The header is the 0.2 one: a 448-byte struct (C99 has no _Static_assert: a negative array size fails the build). */
typedef char flashcore_v2_layout_check[sizeof(flashcore_attention_params) == 448 ? 1 : -1];
typedef char flashcore_v2_minor_check[FLASHCORE_VERSION_MINOR == 2 ? 1 : -1];

static int g_failures = 0;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fputc('\n', stderr);                                            \
      ++g_failures;                                                   \
    }                                                                 \
  } while (0)

#define CANARY 0xC3
enum { CANARY_BYTES = 64 };

/* A 0.2 struct followed by canary bytes the library must never write (nor read: 0xC3... is no valid 0.3 field). */
typedef struct {
  flashcore_attention_params p;
  unsigned char canary[CANARY_BYTES];
} guarded_params;

static int canary_intact(const unsigned char* canary) {
  for (int i = 0; i < CANARY_BYTES; ++i) {
    if (canary[i] != CANARY) return 0;
  }
  return 1;
}

/* Sizes of the problem: B=2, Sq=Sk=S, Hq=4, Hkv=2 (GQA), head_dim chosen below. */
enum { B = 2, S = 24, HQ = 4, HKV = 2 };

static void setup(guarded_params* g, flashcore_dtype dtype, int64_t head_dim, const void* q, const void* k,
                  const void* v, void* o, float* lse) {
  memset(g->canary, CANARY, sizeof(g->canary));
  flashcore_attention_params_init(&g->p); /* the 0.2 macro: init_sized with the caller's sizeof (448) */
  CHECK(canary_intact(g->canary), "flashcore_attention_params_init wrote past the 0.2 struct");
  CHECK(g->p.struct_size == sizeof(flashcore_attention_params), "struct_size = %u", g->p.struct_size);
  CHECK(g->p.out_dtype == FLASHCORE_DTYPE_SAME, "out_dtype = %d", (int)g->p.out_dtype);
  CHECK(g->p.workspace == NULL && g->p.seqused_k == NULL && g->p.k_new == NULL, "0.2 pointers not NULL");
  g->p.q = q, g->p.k = k, g->p.v = v, g->p.o = o, g->p.lse = lse;
  g->p.batch = B, g->p.seqlen_q = S, g->p.seqlen_k = S, g->p.num_heads_q = HQ, g->p.num_heads_kv = HKV;
  g->p.head_dim = head_dim;
  g->p.dtype = dtype;
  flashcore_status st = flashcore_attention_params_set_contiguous(&g->p, 0);
  CHECK(st == FLASHCORE_SUCCESS, "set_contiguous: %s: %s", flashcore_status_string(st), flashcore_last_error());
  CHECK(canary_intact(g->canary), "flashcore_attention_params_set_contiguous wrote past the 0.2 struct");
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
static uint16_t float_to_half(float x) { /* exact for the values used here (m/64, |m| < 64; m/16, |m| < 16) */
  uint16_t sign = x < 0 ? 0x8000u : 0;
  float a = fabsf(x);
  uint16_t bits = 0;
  if (a > 0) {
    int e = 0;
    float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    bits = (uint16_t)(((e - 1 + 15) << 10) | (uint16_t)((m * 2.0f - 1.0f) * 1024.0f));
  }
  return sign | bits;
}
static float half_to_float(uint16_t bits) {
  const int e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
  return (e == 0 ? ldexpf((float)m, -24) : ldexpf(1.0f + (float)m / 1024.0f, e - 15)) * ((bits & 0x8000u) ? -1.0f : 1.0f);
}

/* Host attention in float for (B, S, H, D) contiguous inputs, query head h reading KV head h / (HQ / HKV), sequence
 * b using its first keys[b] keys (none: O = 0, LSE = -inf); checks O and LSE against it. */
static void compare(flashcore_dtype dtype, int64_t D, const float* fq, const float* fk, const float* fv,
                    const uint16_t* host_o, const float* host_lse, const int* keys, const char* what) {
  const float scale = 1.0f / sqrtf((float)D);
  double max_err = 0, max_lse_err = 0;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < HQ; ++h) {
      const int hk = h / (HQ / HKV);
      for (int i = 0; i < S; ++i) {
        float scores[S], mx = -INFINITY, sum = 0;
        const int n = keys[b];
        for (int j = 0; j < n; ++j) {
          float dot = 0;
          for (int d = 0; d < D; ++d) {
            dot += fq[(((size_t)b * S + i) * HQ + h) * D + d] * fk[(((size_t)b * S + j) * HKV + hk) * D + d];
          }
          scores[j] = dot * scale;
          if (scores[j] > mx) mx = scores[j];
        }
        for (int j = 0; j < n; ++j) sum += (scores[j] = expf(scores[j] - mx));
        for (int d = 0; d < D; ++d) {
          float acc = 0;
          for (int j = 0; j < n; ++j) acc += scores[j] * fv[(((size_t)b * S + j) * HKV + hk) * D + d];
          const uint16_t bits = host_o[(((size_t)b * S + i) * HQ + h) * D + d];
          const float got = dtype == FLASHCORE_DTYPE_BF16 ? bf16_to_float(bits) : half_to_float(bits);
          const double err = fabs((double)got - (n > 0 ? acc / sum : 0.0f));
          if (!(err <= max_err)) max_err = err; /* NaN too */
        }
        const float got_lse = host_lse[((size_t)b * HQ + h) * S + i];
        if (n == 0) {
          if (!(got_lse == -INFINITY)) max_lse_err = INFINITY;
        } else {
          const double lse_err = fabs((double)got_lse - (mx + logf(sum)));
          if (!(lse_err <= max_lse_err)) max_lse_err = lse_err;
        }
      }
    }
  }
  printf("GPU forward (0.2 caller, %s): max |O - ref| = %.3g, max |LSE - ref| = %.3g\n", what, max_err, max_lse_err);
  CHECK(max_err < 2e-2, "%s: O error %.3g", what, max_err);
  CHECK(max_lse_err < 1e-3, "%s: LSE error %.3g", what, max_lse_err);
}

/* The workspace the call needs (flashcore_attention_workspace_size, a 0.2 entry point), zero-filled, in *ws (grown
 * when the call needs more than it holds); sets p->workspace / workspace_size. */
static void ensure_workspace(flashcore_attention_params* p, void** ws) {
  uint64_t bytes = 0;
  const flashcore_status st = flashcore_attention_workspace_size(p, &bytes);
  CHECK(st == FLASHCORE_SUCCESS, "workspace_size: %s: %s", flashcore_status_string(st), flashcore_last_error());
  if (bytes <= p->workspace_size) return;
  if (*ws) cudaFree(*ws);
  *ws = NULL;
  CHECK(cudaMalloc(ws, bytes) == cudaSuccess, "cudaMalloc(workspace of %llu bytes)", (unsigned long long)bytes);
  CHECK(cudaMemset(*ws, 0, bytes) == cudaSuccess, "cudaMemset(workspace)");
  p->workspace = *ws;
  p->workspace_size = bytes;
}

/* Small forward passes on a Hopper GPU (bf16 or fp16 are both 2 bytes; inputs are exact in both). */
static void run_on_gpu(flashcore_dtype dtype, int64_t D) {
  const size_t nq = (size_t)B * S * HQ * D, nkv = (size_t)B * S * HKV * D, nlse = (size_t)B * HQ * S;
  uint16_t* host_q = malloc(nq * 2);
  uint16_t* host_k = malloc(nkv * 2);
  uint16_t* host_v = malloc(nkv * 2);
  uint16_t* host_o = malloc(nq * 2);
  float* host_lse = malloc(nlse * sizeof(float));
  float* fq = malloc(nq * sizeof(float));
  float* fk = malloc(nkv * sizeof(float));
  float* fv = malloc(nkv * sizeof(float));
  for (size_t i = 0; i < nq; ++i) fq[i] = (float)((int)((i * 7) % 23) - 11) / 64.0f;
  for (size_t i = 0; i < nkv; ++i) {
    fk[i] = (float)((int)((i * 5) % 19) - 9) / 64.0f;
    fv[i] = (float)((int)((i * 3) % 17) - 8) / 16.0f;
  }
  for (size_t i = 0; i < nq; ++i) host_q[i] = dtype == FLASHCORE_DTYPE_BF16 ? float_to_bf16(fq[i]) : float_to_half(fq[i]);
  for (size_t i = 0; i < nkv; ++i) {
    host_k[i] = dtype == FLASHCORE_DTYPE_BF16 ? float_to_bf16(fk[i]) : float_to_half(fk[i]);
    host_v[i] = dtype == FLASHCORE_DTYPE_BF16 ? float_to_bf16(fv[i]) : float_to_half(fv[i]);
  }
  void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dws = NULL;
  float* dlse = NULL;
  int32_t* dused = NULL;
  CHECK(cudaMalloc(&dq, nq * 2) == cudaSuccess, "cudaMalloc");
  CHECK(cudaMalloc(&dk, nkv * 2) == cudaSuccess, "cudaMalloc");
  CHECK(cudaMalloc(&dv, nkv * 2) == cudaSuccess, "cudaMalloc");
  CHECK(cudaMalloc(&dout, nq * 2) == cudaSuccess, "cudaMalloc");
  CHECK(cudaMalloc((void**)&dlse, nlse * sizeof(float)) == cudaSuccess, "cudaMalloc");
  CHECK(cudaMalloc((void**)&dused, B * sizeof(int32_t)) == cudaSuccess, "cudaMalloc");
  if (g_failures == 0) {
    cudaMemcpy(dq, host_q, nq * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dk, host_k, nkv * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, host_v, nkv * 2, cudaMemcpyHostToDevice);
    guarded_params g;
    setup(&g, dtype, D, dq, dk, dv, dout, dlse);
    g.p.lse_capacity = (int64_t)nlse; /* a 0.2 field, exact */
    ensure_workspace(&g.p, &dws);
    char config[128] = "";
    flashcore_status st = flashcore_attention_selected_config(&g.p, config, sizeof config);
    CHECK(st == FLASHCORE_SUCCESS && config[0] != '\0', "selected_config: %s: %s", flashcore_status_string(st),
          flashcore_last_error());

    /* 1. Dense, every key. */
    cudaMemset(dout, 0xff, nq * 2);
    cudaMemset(dlse, 0xff, nlse * sizeof(float));
    st = flashcore_attention_forward(&g.p, NULL);
    CHECK(st == FLASHCORE_SUCCESS, "forward: %s: %s", flashcore_status_string(st), flashcore_last_error());
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
    cudaMemcpy(host_o, dout, nq * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(host_lse, dlse, nlse * sizeof(float), cudaMemcpyDeviceToHost);
    const int all_keys[B] = {S, S};
    compare(dtype, D, fq, fk, fv, host_o, host_lse, all_keys, config);

    /* 2. seqused_k (a 0.2 field): sequence 0 uses 5 keys, sequence 1 none (O = 0, LSE = -inf). */
    const int32_t used[B] = {5, 0};
    const int used_keys[B] = {5, 0};
    cudaMemcpy(dused, used, sizeof(used), cudaMemcpyHostToDevice);
    g.p.seqused_k = dused;
    ensure_workspace(&g.p, &dws);
    cudaMemset(dout, 0xff, nq * 2);
    cudaMemset(dlse, 0xff, nlse * sizeof(float));
    st = flashcore_attention_forward(&g.p, NULL);
    CHECK(st == FLASHCORE_SUCCESS, "forward (seqused_k): %s: %s", flashcore_status_string(st), flashcore_last_error());
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
    cudaMemcpy(host_o, dout, nq * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(host_lse, dlse, nlse * sizeof(float), cudaMemcpyDeviceToHost);
    compare(dtype, D, fq, fk, fv, host_o, host_lse, used_keys, "seqused_k");
    CHECK(canary_intact(g.canary), "a GPU call wrote past the 0.2 struct");
  }
  cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse), cudaFree(dused);
  if (dws) cudaFree(dws);
  free(host_q), free(host_k), free(host_v), free(host_o), free(host_lse), free(fq), free(fk), free(fv);
}

int main(void) {
  /* ---- capabilities with the 0.2 struct (its layout did not change in 0.3) ---- */
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  CHECK(caps.struct_size == sizeof(flashcore_capabilities), "caps struct_size = %u", caps.struct_size);
  flashcore_status st = flashcore_get_capabilities(&caps);
  CHECK(st == FLASHCORE_SUCCESS, "get_capabilities: %s: %s", flashcore_status_string(st), flashcore_last_error());
  CHECK(caps.num_dtypes >= 1 && caps.num_head_dims >= 1, "no compiled kernel reported");
  /* The loaded library's own params struct is at least the 0.2 one. */
  CHECK(caps.params_struct_size >= sizeof(flashcore_attention_params), "params_struct_size = %u",
        caps.params_struct_size);
  int major = -1, minor = -1, patch = -1;
  flashcore_version(&major, &minor, &patch);
  CHECK(major == FLASHCORE_VERSION_MAJOR && minor >= FLASHCORE_VERSION_MINOR, "library version %d.%d", major, minor);
  if (g_failures) return 1;

  /* A 16-bit dtype and a head dim that this build compiled for it (the argument check says; no GPU needed). */
  const uintptr_t base = (uintptr_t)1 << 32, step = (uintptr_t)1 << 24;
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int64_t D = 0;
  guarded_params g;
  for (int i = 0; i < caps.num_dtypes && i < FLASHCORE_MAX_CAPS && D == 0; ++i) {
    if (caps.dtypes[i] != FLASHCORE_DTYPE_FP16 && caps.dtypes[i] != FLASHCORE_DTYPE_BF16) continue;
    for (int j = 0; j < caps.num_head_dims && j < FLASHCORE_MAX_CAPS && D == 0; ++j) {
      setup(&g, caps.dtypes[i], caps.head_dims[j], (const void*)base, (const void*)(base + step),
            (const void*)(base + 2 * step), (void*)(base + 3 * step), (float*)(base + 4 * step));
      if (flashcore_attention_validate(&g.p) == FLASHCORE_SUCCESS) dtype = caps.dtypes[i], D = caps.head_dims[j];
    }
  }
  if (D == 0) {
    printf("SKIPPED: no 16-bit kernel in this build (a 0.2 caller has no 8-bit inputs)\n");
    return g_failures ? 1 : 0;
  }
  printf("0.2 caller: library %s, dtype %d, head_dim %lld, params struct %u bytes (library: %u)\n",
         flashcore_version_string(), (int)dtype, (long long)D, (unsigned)sizeof(flashcore_attention_params),
         caps.params_struct_size);

  /* ---- argument path with fake 16-byte aligned device pointers (never dereferenced) ---- */
  setup(&g, dtype, D, (const void*)base, (const void*)(base + step), (const void*)(base + 2 * step),
        (void*)(base + 3 * step), (float*)(base + 4 * step));
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_SUCCESS, "validate: %s: %s", flashcore_status_string(st), flashcore_last_error());
  /* 0.1 fields are still read at their places. */
  g.p.q_strides.seq = 12;
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_ERROR_INVALID_STRIDE, "bad stride gave %s", flashcore_status_string(st));
  CHECK(strstr(flashcore_last_error(), "q_strides") != NULL, "message '%s' does not name q_strides",
        flashcore_last_error());
  g.p.q_strides.seq = HQ * D;
  /* 0.2 fields are read at their places (the library must not take the 0.2 struct for a 0.1 one). */
  g.p.lse_capacity = (int64_t)B * HQ * S - 1;
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_ERROR_INVALID_SIZE, "lse_capacity too small gave %s", flashcore_status_string(st));
  CHECK(strstr(flashcore_last_error(), "lse_capacity") != NULL, "message '%s'", flashcore_last_error());
  g.p.lse_capacity = (int64_t)B * HQ * S;
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_SUCCESS, "exact lse_capacity: %s: %s", flashcore_status_string(st), flashcore_last_error());
  g.p.reserved = 1;
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_ERROR_INVALID_ARGUMENT && strstr(flashcore_last_error(), "reserved") != NULL,
        "reserved = 1 gave %s: %s", flashcore_status_string(st), flashcore_last_error());
  g.p.reserved = 0;
  g.p.flags = 1u << 31;
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_ERROR_INVALID_ARGUMENT && strstr(flashcore_last_error(), "flags") != NULL,
        "flags = 1 << 31 gave %s: %s", flashcore_status_string(st), flashcore_last_error());
  g.p.flags = 0;
  g.p.workspace_size = 4096; /* with workspace NULL */
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_ERROR_NULL_POINTER && strstr(flashcore_last_error(), "workspace") != NULL,
        "workspace_size without workspace gave %s: %s", flashcore_status_string(st), flashcore_last_error());
  g.p.workspace = (void*)(base + 5 * step);
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_SUCCESS, "workspace: %s: %s", flashcore_status_string(st), flashcore_last_error());
  g.p.workspace = NULL, g.p.workspace_size = 0;
  g.p.out_dtype = dtype; /* naming the input dtype is the same as SAME */
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_SUCCESS, "out_dtype = dtype: %s: %s", flashcore_status_string(st), flashcore_last_error());
  g.p.out_dtype = FLASHCORE_DTYPE_SAME;
  g.p.seqused_k = (const int32_t*)(base + 6 * step);
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_SUCCESS, "seqused_k: %s: %s", flashcore_status_string(st), flashcore_last_error());
  g.p.seqused_k = NULL;
  /* Sizes that are no layout are refused; the 0.2 size is not taken for the 0.1 one or the current one. */
  g.p.struct_size = 12;
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_ERROR_INVALID_ARGUMENT, "struct_size 12 gave %s", flashcore_status_string(st));
  g.p.struct_size = sizeof(flashcore_attention_params) + 4;
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_ERROR_INVALID_ARGUMENT, "struct_size 452 gave %s", flashcore_status_string(st));
  g.p.struct_size = sizeof(flashcore_attention_params);
  st = flashcore_attention_validate(&g.p);
  CHECK(st == FLASHCORE_SUCCESS, "validate again: %s: %s", flashcore_status_string(st), flashcore_last_error());
  CHECK(canary_intact(g.canary), "a call wrote past the 0.2 struct");

  /* ---- the GPU part ---- */
  int count = 0, device = 0, cc_major = 0, cc_minor = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      cc_major != 9 || cc_minor != 0) {
    (void)cudaGetLastError();
    printf("SKIPPED: no Hopper GPU (the forward passes of a 0.2 caller were not run)\n");
    /* Without a device, the workspace query and forward must say so, not crash, and write nothing past the struct. */
    uint64_t bytes = 777;
    st = flashcore_attention_workspace_size(&g.p, &bytes);
    CHECK(st == FLASHCORE_ERROR_NO_DEVICE || st == FLASHCORE_ERROR_UNSUPPORTED_ARCH || st == FLASHCORE_ERROR_CUDA,
          "workspace_size without a Hopper GPU: %s", flashcore_status_string(st));
    st = flashcore_attention_forward(&g.p, NULL);
    CHECK(st == FLASHCORE_ERROR_NO_DEVICE || st == FLASHCORE_ERROR_UNSUPPORTED_ARCH, "forward without a Hopper GPU: %s",
          flashcore_status_string(st));
    CHECK(canary_intact(g.canary), "a call wrote past the 0.2 struct");
  } else {
    run_on_gpu(dtype, D);
  }

  if (g_failures) {
    fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  printf("PASSED: 0.2 caller\n");
  return 0;
}
