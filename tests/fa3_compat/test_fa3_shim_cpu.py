"""CPU tests of the FA3 shim (flash_attn_interface.py) and of fa3_plugin.py: no GPU, no library.

    python3 -m pytest tests/fa3_compat -q

- FA3's names and parameter order; every unsupported argument skips ("flashcore: ... not supported") before
  FlashCore is called; the supported ones reach FlashCore's front ends with the arguments they mean (recorded by
  stand-ins with the real signatures); a call that FlashCore has no backward for returns the real forward and skips
  at backward time, and one it has a backward for keeps FlashCore's own graph; without stand-ins, a supported call
  ends in FlashCore's own error, not in a skip.
- The plugin's selection, sampling and summary helpers.
- With FA3's files in .carry/fa3tests/ (else skipped): collection of FA3's test module through the plugin, its
  items all skipped for want of a GPU (none passes), and the refusal of another `flash_attn_interface`.
CI does not collect this folder (it runs python/tests).
"""

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import fa3_plugin as plugin  # noqa: E402
import flash_attn_interface as shim  # noqa: E402
import flashcore  # noqa: E402

SKIPPED = pytest.skip.Exception
HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
FA3_DIR = Path(os.environ.get("FLASHCORE_FA3_DIR", REPO_ROOT / ".carry" / "fa3tests"))
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn

# FA3's parameter names, in order (hopper/flash_attn_interface.py at the commit in .carry/fa3tests/SOURCE.txt).
FA3_PARAMS = {
    "flash_attn_func": ["q", "k", "v", "softmax_scale", "causal", "qv", "q_descale", "k_descale", "v_descale",
                        "window_size", "attention_chunk", "softcap", "num_splits", "pack_gqa", "deterministic",
                        "sm_margin", "return_attn_probs"],
    "flash_attn_varlen_func": ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
                               "seqused_q", "seqused_k", "softmax_scale", "causal", "qv", "q_descale", "k_descale",
                               "v_descale", "window_size", "attention_chunk", "softcap", "num_splits", "pack_gqa",
                               "deterministic", "sm_margin", "return_attn_probs"],
    "flash_attn_with_kvcache": ["q", "k_cache", "v_cache", "k", "v", "qv", "rotary_cos", "rotary_sin",
                                "cache_seqlens", "cache_batch_idx", "cache_leftpad", "page_table", "cu_seqlens_q",
                                "cu_seqlens_k_new", "max_seqlen_q", "rotary_seqlens", "q_descale", "k_descale",
                                "v_descale", "softmax_scale", "causal", "window_size", "attention_chunk", "softcap",
                                "rotary_interleaved", "scheduler_metadata", "num_splits", "pack_gqa", "sm_margin",
                                "return_softmax_lse"],
    "get_scheduler_metadata": ["batch_size", "max_seqlen_q", "max_seqlen_k", "num_heads_q", "num_heads_kv",
                               "headdim", "cache_seqlens", "qkv_dtype", "headdim_v", "cu_seqlens_q",
                               "cu_seqlens_k_new", "cache_leftpad", "page_size", "max_seqlen_k_new", "causal",
                               "window_size", "attention_chunk", "has_softcap", "num_splits", "pack_gqa",
                               "sm_margin"],
    "flash_attn_combine": ["out_partial", "lse_partial", "out", "out_dtype"],
}
# The defaults the FA3 tests rely on.
FA3_DEFAULTS = {("flash_attn_func", "num_splits"): 1, ("flash_attn_varlen_func", "num_splits"): 1,
                ("flash_attn_with_kvcache", "num_splits"): 0, ("flash_attn_with_kvcache", "rotary_interleaved"): True,
                ("flash_attn_func", "window_size"): (-1, -1), ("flash_attn_func", "softcap"): 0.0}


def ref_attention(q, k, v, causal=False, softmax_scale=None, **_):
    """Plain attention on the CPU (B, S, H, D), GQA by repetition: the stand-in's arithmetic, with autograd."""
    scale = softmax_scale or q.shape[-1] ** -0.5
    g = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(g, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        mask = torch.arange(sk)[None, :] > torch.arange(sq)[:, None] + sk - sq
        s = s.masked_fill(mask, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v.float()).to(q.dtype)


VARIANT_PARAMS = (("window_size", (-1, -1)), ("attention_chunk", 0), ("softcap", 0.0), ("sinks", None))


def with_variants(signature):
    """A front end's signature with the variant arguments (FlashCore 0.5's), whether or not this checkout's python/
    has them yet: the shim is tested against the 0.5 front ends, and against an older one below."""
    params = list(signature.parameters.values())
    names = {p.name for p in params}
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, d in VARIANT_PARAMS
               if n not in names]
    return signature.replace(parameters=params)


class Library:
    """Stand-ins for what the shim asks of the library: compiled dtypes / head dims / (head_dim, head_dim_v) pairs, the
    probes' answers, and recording front ends with FlashCore's real signatures."""

    def __init__(self, monkeypatch):
        self.head_dims = (64, 128, 256)
        self.head_dim_pairs = ((192, 128),)
        self.dtypes = ("float16", "bfloat16", "float8_e4m3fn")
        self.answers = {}  # "backward" / "fp8" / "kv_fp8" / variant name -> None (runs) or the probe's message
        self.probed = []
        self.calls = []
        self.serving = True  # the library takes the 0.8 serving arguments
        self.kv_fp8 = True  # the library takes an e4m3 KV cache (0.9)
        monkeypatch.setattr(shim, "has_kvcache_serving", lambda: self.serving)
        monkeypatch.setattr(shim, "has_kv_fp8", lambda: self.kv_fp8)
        monkeypatch.setattr(shim, "compiled_head_dims", lambda: self.head_dims)
        monkeypatch.setattr(shim, "compiled_dtypes", lambda: self.dtypes)
        monkeypatch.setattr(shim, "compiled_head_dim_pairs", lambda: self.head_dim_pairs)
        monkeypatch.setattr(shim, "probe", self.probe)
        for name in ("attention", "varlen_attention", "attention_with_kvcache"):
            monkeypatch.setattr(flashcore, name, self.recorder(name, getattr(flashcore, name)))

    def probe(self, key, thunk):
        assert callable(thunk)
        self.probed.append(key)
        kind = key[0] if key[0] in ("backward", "fp8", "kv_fp8") else key[1]
        return self.answers.get(kind)

    def recorder(self, name, real):
        def record(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            if name == "attention":
                out = ref_attention(*args, **kwargs)
                lse = torch.zeros(out.shape[0], out.shape[2], out.shape[1])
                return (out, lse) if kwargs.get("return_lse") else out
            if name == "varlen_attention":
                out = args[0].new_zeros(args[0].shape[:2] + args[2].shape[2:])
                return (out, torch.zeros(out.shape[1], out.shape[0])) if kwargs.get("return_lse") else out
            q = args[0]
            if kwargs.get("cu_seqlens_q") is not None:  # packed queries: out (total_q, H, Dv), lse (H, total_q)
                out = q.new_zeros(q.shape[:2] + args[2].shape[3:])
                return (out, torch.zeros(q.shape[1], q.shape[0])) if kwargs.get("return_softmax_lse") else out
            out = q.new_zeros(q.shape[:3] + args[2].shape[3:])
            return (out, torch.zeros(q.shape[0], q.shape[2], q.shape[1])) if kwargs.get("return_softmax_lse") else out

        record.__signature__ = with_variants(inspect.signature(real))
        return record


@pytest.fixture
def lib(monkeypatch):
    monkeypatch.delenv("FLASHCORE_FA3_HINTS", raising=False)
    return Library(monkeypatch)


def qkv(b=2, sq=8, sk=8, hq=4, hk=2, d=64, dv=None, dtype=BF16, requires_grad=False):
    q = torch.randn(b, sq, hq, d).to(dtype)
    k = torch.randn(b, sk, hk, d).to(dtype)
    v = torch.randn(b, sk, hk, dv or d).to(dtype)
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_()
    return q, k, v


def packed(total_q=12, total_k=10, hq=4, hk=2, d=64, dv=None, dtype=BF16):
    cu_q = torch.tensor([0, 5, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 10], dtype=torch.int32)
    q = torch.randn(total_q, hq, d).to(dtype)
    k, v = torch.randn(total_k, hk, d).to(dtype), torch.randn(total_k, hk, dv or d).to(dtype)
    return q, k, v, cu_q, cu_k


def cache(b=2, sq=1, s_cache=64, hq=4, hk=2, d=128, dv=None, page=None):
    q = torch.randn(b, sq, hq, d).to(BF16)
    if page is None:
        kc, vc = (torch.randn(b, s_cache, hk, dim).to(BF16) for dim in (d, dv or d))
        table = None
    else:
        pages = s_cache // page
        kc, vc = (torch.randn(b * pages, page, hk, dim).to(BF16) for dim in (d, dv or d))
        table = torch.arange(b * pages, dtype=torch.int32).reshape(b, pages)
    lens = torch.tensor([5, 40], dtype=torch.int32)[:b]
    return q, kc, vc, lens, table


# ---------------------------------------------------------------------------------------------------------------
# Names.


@pytest.mark.parametrize("name", sorted(FA3_PARAMS))
def test_fa3_names_and_parameter_order(name):
    assert list(inspect.signature(getattr(shim, name)).parameters) == FA3_PARAMS[name]


@pytest.mark.parametrize("fn,param", sorted(FA3_DEFAULTS))
def test_fa3_defaults(fn, param):
    assert inspect.signature(getattr(shim, fn)).parameters[param].default == FA3_DEFAULTS[(fn, param)]


# ---------------------------------------------------------------------------------------------------------------
# Skips: each before FlashCore is called.


def _dense(**kw):
    spec = kw.pop("_qkv", {})
    return lambda: shim.flash_attn_func(*qkv(**spec), **kw)


def _varlen(**kw):
    q, k, v, cu_q, cu_k = packed(dtype=kw.pop("_dtype", BF16))
    return lambda: shim.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 6, **kw)


def _kvcache(page=None, **kw):
    q, kc, vc, lens, table = cache(page=page)
    return lambda: shim.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, **kw)


SKIP_CASES = {
    "dense qv": (_dense(qv=torch.randn(2, 8, 4, 64).to(BF16)), "flashcore: qv not supported"),
    "dense head dim 96": (_dense(_qkv=dict(d=96)), "flashcore: head_dim=96 not supported (compiled head dims"),
    "dense dv != d": (_dense(_qkv=dict(d=64, dv=256)), "flashcore: head_dim_v != head_dim not supported ((head_dim, "
                                                       "head_dim_v) = (64, 256) is not compiled into this library; "
                                                       "compiled pairs: [(192, 128)])"),
    "dense fp8 dv != d": (_dense(_qkv=dict(d=192, dv=128, dtype=FP8)),
                          "flashcore: head_dim_v != head_dim with float8_e4m3fn inputs not supported (v has 128, q and "
                          "k 192: FlashCore's 8-bit path takes one head dim"),
    "dense float32": (_dense(_qkv=dict(dtype=torch.float32)), "flashcore: dtype float32 not supported"),
    "dense descale with bf16": (_dense(q_descale=torch.ones(2, 2)), "flashcore: q_descale with bfloat16 inputs"),
    "dense pack_gqa": (_dense(pack_gqa=True), "flashcore: pack_gqa=True not supported"),
    "dense num_splits 3": (_dense(num_splits=3), "flashcore: num_splits=3 not supported"),
    "dense sm_margin": (_dense(sm_margin=4), "flashcore: sm_margin=4 not supported"),
    "dense fp8 softcap": (_dense(_qkv=dict(dtype=FP8), softcap=15.0),
                          "flashcore: softcap with float8_e4m3fn inputs not supported"),
    "dense fp8 window": (_dense(_qkv=dict(dtype=FP8), window_size=(3, 3)),
                         "flashcore: window_size with float8_e4m3fn inputs not supported"),
    "varlen fp8": (_varlen(_dtype=FP8), "flashcore: float8_e4m3fn inputs to flash_attn_varlen_func not supported"),
    "varlen qv": (_varlen(qv=torch.zeros(12, 4, 64)), "flashcore: qv not supported"),
    "varlen deterministic": (_varlen(deterministic=True),
                             "flashcore: deterministic=True in flash_attn_varlen_func not supported"),
    "varlen num_splits 3": (_varlen(num_splits=3), "flashcore: num_splits=3 not supported"),
    "varlen pack_gqa": (_varlen(pack_gqa=True), "flashcore: pack_gqa=True not supported"),
    "varlen descale": (_varlen(k_descale=torch.ones(2, 2)), "flashcore: k_descale in flash_attn_varlen_func"),
    "kvcache qv": (_kvcache(qv=torch.zeros(2, 1, 4, 128)), "flashcore: qv not supported"),
    "kvcache paged leftpad": (_kvcache(page=16, cache_leftpad=torch.tensor([1, 0], dtype=torch.int32)),
                              "flashcore: cache_leftpad with page_table not supported (FlashCore's paged caches take "
                              "no left padding, as FlashAttention-2's)"),
    "kvcache scheduler metadata": (_kvcache(scheduler_metadata=torch.zeros(4, dtype=torch.int32)),
                                   "flashcore: scheduler_metadata not supported"),
    "kvcache pack_gqa": (_kvcache(pack_gqa=True), "flashcore: pack_gqa=True not supported"),
    "kvcache descale": (_kvcache(v_descale=torch.ones(2, 2)), "flashcore: v_descale in flash_attn_with_kvcache"),
    "get_scheduler_metadata": (lambda: shim.get_scheduler_metadata(2, 1, 64, 4, 2, 128, torch.zeros(2)),
                               "flashcore: get_scheduler_metadata not supported"),
    "flash_attn_combine": (lambda: shim.flash_attn_combine(torch.zeros(2, 1, 1, 1, 8), torch.zeros(2, 1, 1, 1)),
                           "flashcore: flash_attn_combine not supported"),
}


@pytest.mark.parametrize("case", sorted(SKIP_CASES))
def test_unsupported_skips_before_flashcore(lib, case):
    call, reason = SKIP_CASES[case]
    with pytest.raises(SKIPPED) as info:
        call()
    assert str(info.value.msg).startswith(reason), info.value.msg
    assert lib.calls == [], "FlashCore was called although the shim skipped"


def test_kvcache_fp8_q_is_passed(lib):
    """FA3's fp8 KV-cache cases quantize q with the cache: an e4m3 q on an e4m3 cache reaches FlashCore with
    q_descale as FA3 got it; an e4m3 q on a 16-bit cache skips."""
    q, kc, vc, lens, _ = cache()
    ones = torch.ones(2, 2)
    shim.flash_attn_with_kvcache(q.to(FP8), kc.to(FP8), vc.to(FP8), cache_seqlens=lens, q_descale=ones,
                                 k_descale=ones, v_descale=ones)
    (_, args, kwargs), = lib.calls
    assert args[0].dtype == FP8 and kwargs["q_descale"] is ones and kwargs["k_descale"] is ones
    with pytest.raises(SKIPPED, match="float8_e4m3fn q with a bfloat16 cache in flash_attn_with_kvcache not "
                                      "supported"):
        shim.flash_attn_with_kvcache(q.to(FP8), kc, vc, cache_seqlens=lens)
    assert len(lib.calls) == 1


def _e4m3_cache(page=None):
    q, kc, vc, lens, table = cache(page=page)
    return q, kc.to(FP8), vc.to(FP8), lens, table


@pytest.mark.parametrize("page", [None, 16])
def test_kvcache_e4m3_cache_is_passed(lib, page):
    """bf16 q on an e4m3 cache (FlashCore 0.9): the call reaches flashcore.attention_with_kvcache with k_descale /
    v_descale as FA3 got them (left out when None), after one probe of the library."""
    q, kc, vc, lens, table = _e4m3_cache(page)
    kd, vd = torch.rand(2, 2), torch.rand(2, 2)
    out, lse = shim.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, k_descale=kd,
                                           v_descale=vd, causal=True, return_softmax_lse=True)
    shim.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, cache_batch_idx=lens * 0)
    (_, args, first), (_, _, second) = lib.calls
    assert args[1] is kc and args[2] is vc and first["k_descale"] is kd and first["v_descale"] is vd
    assert first.get("block_table") is table and first["causal"] is True  # (None without a page table)
    assert "k_descale" not in second and "v_descale" not in second and "cache_batch_idx" in second
    assert out.shape == q.shape and lse.shape == (2, 4, 1)
    assert {key[0] for key in lib.probed} == {"kv_fp8"}


def _e4m3_call(page=None, **kw):
    def call():
        q, kc, vc, lens, table = _e4m3_cache(page)
        shim.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, **kw)
    return call


E4M3_SKIPS = {
    "append": (_e4m3_call(k=torch.zeros(2, 1, 2, 128).to(FP8), v=torch.zeros(2, 1, 2, 128).to(FP8)),
               "flashcore: float8_e4m3fn k / v appended to a float8_e4m3fn KV cache under bfloat16 q not supported"),
    "softcap": (_e4m3_call(softcap=15.0), "flashcore: softcap with a float8_e4m3fn KV cache not supported"),
    "window": (_e4m3_call(window_size=(8, 0), causal=True),
               "flashcore: window_size with a float8_e4m3fn KV cache not supported"),
    "chunk": (_e4m3_call(attention_chunk=16), "flashcore: attention_chunk with a float8_e4m3fn KV cache"),
    "page 4": (_e4m3_call(page=4), "flashcore: page_size=4 with a float8_e4m3fn KV cache not supported"),
    "q_descale": (_e4m3_call(q_descale=torch.ones(2, 2)), "flashcore: q_descale with bfloat16 q in "
                                                          "flash_attn_with_kvcache not supported (FlashCore's 16-bit q "
                                                          "takes no descale"),
    "k_descale bf16 cache": (_kvcache(k_descale=torch.ones(2, 2)),
                             "flashcore: k_descale in flash_attn_with_kvcache not supported (FlashCore's descales "
                             "scale an e4m3 KV cache only, this one is bfloat16)"),
}


@pytest.mark.parametrize("case", sorted(E4M3_SKIPS))
def test_kvcache_e4m3_cache_skips(lib, case):
    call, reason = E4M3_SKIPS[case]
    with pytest.raises(SKIPPED) as info:
        call()
    assert str(info.value.msg).startswith(reason), info.value.msg
    assert lib.calls == []


def test_kvcache_e4m3_cache_causal_window_is_no_variant(lib):
    """causal=True with window_size (-1, 0) is plain causal attention (FlashCore's rule too): not skipped."""
    _e4m3_call(window_size=(-1, 0), causal=True)()
    assert len(lib.calls) == 1


def test_kvcache_e4m3_cache_skips_with_an_older_library_or_a_refusing_probe(lib):
    lib.kv_fp8 = False
    with pytest.raises(SKIPPED) as info:
        _e4m3_call()()
    assert info.value.msg == ("flashcore: a float8_e4m3fn KV cache not supported (the loaded libflashcore.so predates "
                              "FlashCore 0.9's e4m3 KV cache)")
    lib.kv_fp8 = True
    lib.answers["kv_fp8"] = "probe: ValueError: no sm90 kernel"
    with pytest.raises(SKIPPED) as info:
        _e4m3_call(causal=True)()
    assert info.value.msg == ("flashcore: a float8_e4m3fn KV cache with bfloat16 q, head_dim=128 (causal) not "
                              "supported (probe: ValueError: no sm90 kernel)")
    assert lib.calls == []


def test_kvcache_e4m3_probe_is_an_e4m3_call(monkeypatch):
    """The probe's tiny call has an e4m3 cache and descales of 1 (recorded by a stand-in front end)."""
    seen = []
    monkeypatch.setattr(flashcore, "attention_with_kvcache", lambda q, k, v, **kw: seen.append((q, k, v, kw)))
    shim._probe_call("attention_with_kvcache", BF16, 128, True, "cpu", {}, kv_fp8=True)()
    (q, k, v, kw), = seen
    assert q.dtype == BF16 and k.dtype == v.dtype == FP8 and kw["causal"] is True
    assert torch.equal(kw["k_descale"], torch.ones(1, 1)) and torch.equal(kw["v_descale"], torch.ones(1, 1))


@pytest.mark.parametrize("variant,kwargs", [("attention_chunk", dict(attention_chunk=17)),
                                            ("softcap", dict(softcap=15.0)),
                                            ("window_size", dict(window_size=(4, 2)))])
def test_variant_the_library_refuses_skips_quoting_the_probe(lib, variant, kwargs):
    lib.answers[variant] = "probe: ValueError: refused by this library"
    for call in (_dense(**kwargs), _varlen(**kwargs), _kvcache(**kwargs)):
        with pytest.raises(SKIPPED) as info:
            call()
        assert info.value.msg == f"flashcore: {variant} not supported (probe: ValueError: refused by this library)"
    assert lib.calls == []
    assert {key[0] for key in lib.probed} == {"attention", "varlen_attention", "attention_with_kvcache"}


def test_variant_the_front_end_lacks_skips(lib, monkeypatch):
    def old_attention(q, k, v, *, causal=False, softmax_scale=None, return_lse=False):
        raise AssertionError("not to be called")

    monkeypatch.setattr(flashcore, "attention", old_attention)
    with pytest.raises(SKIPPED, match=r"flashcore: softcap not supported \(flashcore.attention has no softcap "):
        shim.flash_attn_func(*qkv(), softcap=15.0)


def test_fp8_head_dim_without_kernel_skips(lib):
    lib.answers["fp8"] = "probe: ValueError: no 8-bit kernel"
    q, k, v = qkv(d=256, dtype=FP8)
    with pytest.raises(SKIPPED, match=r"flashcore: float8_e4m3fn with head_dim=256 \(causal\) not supported "
                                      r"\(probe: ValueError: no 8-bit kernel\)"):
        shim.flash_attn_func(q, k, v, causal=True)
    assert lib.calls == []


def test_fp8_dtype_not_compiled_skips(lib):
    lib.dtypes = ("float16", "bfloat16")
    with pytest.raises(SKIPPED, match="flashcore: float8_e4m3fn not supported"):
        shim.flash_attn_func(*qkv(dtype=FP8))


# ---------------------------------------------------------------------------------------------------------------
# What reaches FlashCore.


def test_dense_plain_call(lib):
    q, k, v = qkv()
    out = shim.flash_attn_func(q, k, v, causal=True)
    (name, args, kwargs), = lib.calls
    assert name == "attention" and all(a is b for a, b in zip(args, (q, k, v)))
    assert kwargs == dict(causal=True, softmax_scale=None, return_lse=False)
    assert torch.equal(out, ref_attention(q, k, v, causal=True))
    assert shim.calls >= 1


def test_dense_options_are_passed(lib):
    q, k, v = qkv()
    out, lse = shim.flash_attn_func(q, k, v, 0.3, False, window_size=torch.tensor([3, 5]), softcap=15.0,
                                    deterministic=True, num_splits=0, pack_gqa=False, return_attn_probs=True)
    (_, _, kwargs), = lib.calls
    assert kwargs == dict(causal=False, softmax_scale=0.3, return_lse=True, window_size=(3, 5), softcap=15.0,
                          deterministic=True)
    assert type(kwargs["window_size"][0]) is int
    assert lse.shape == (2, 4, 8)


def test_attention_chunk_is_passed_on(lib):
    """FA3's attention_chunk reaches each FlashCore front end as its attention_chunk (an int), after a probe of the same
    kind of call; alone or with a window and softcap."""
    q, kc, vc, lens, _ = cache()
    qp, kp, vp, cu_q, cu_k = packed()
    shim.flash_attn_func(*qkv(), causal=True, attention_chunk=17)
    shim.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, 7, 6, causal=True, attention_chunk=torch.tensor(5).item())
    shim.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, window_size=(9, 0), softcap=15.0,
                                 attention_chunk=8192)
    assert [(name, kwargs.get("attention_chunk")) for name, _, kwargs in lib.calls] == [
        ("attention", 17), ("varlen_attention", 5), ("attention_with_kvcache", 8192)]
    assert all(type(kwargs["attention_chunk"]) is int for _, _, kwargs in lib.calls)
    assert lib.calls[2][2]["window_size"] == (9, 0) and lib.calls[2][2]["softcap"] == 15.0
    probed = [key for key in lib.probed if key[1] == "attention_chunk"]
    assert [key[0] for key in probed] == ["attention", "varlen_attention", "attention_with_kvcache"]


def test_attention_chunk_backward_is_flashcores(lib):
    """A chunked call whose inputs require grad, with a library whose backward takes the chunk (its probe passes): the
    result keeps FlashCore's own graph, and the backward probe was asked with attention_chunk."""
    q, k, v = qkv(requires_grad=True)
    out = shim.flash_attn_func(q, k, v, causal=True, attention_chunk=4)
    assert "SkipOnBackward" not in type(out.grad_fn).__name__
    assert ("backward", "attention", BF16, 64, 64, True, ("attention_chunk",), False, False, False) in lib.probed


def test_dense_no_window_passes_none(lib):
    shim.flash_attn_func(*qkv(), window_size=[-1, -1], softcap=0.0, attention_chunk=0)
    (_, _, kwargs), = lib.calls
    assert "window_size" not in kwargs and "softcap" not in kwargs and "attention_chunk" not in kwargs


def test_dense_fp8_descales(lib):
    q, k, v = qkv(dtype=FP8)
    qd, kd, vd = (torch.rand(2, 2) for _ in range(3))
    shim.flash_attn_func(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd)
    (_, _, kwargs), = lib.calls
    assert kwargs["q_descale"] is qd and kwargs["k_descale"] is kd and kwargs["v_descale"] is vd


def test_hints_ignore_mode_runs_flashcores_strategy(lib, monkeypatch):
    monkeypatch.setenv("FLASHCORE_FA3_HINTS", "ignore")
    shim.flash_attn_func(*qkv(), pack_gqa=True, num_splits=3, sm_margin=8)
    q, k, v, cu_q, cu_k = packed()
    shim.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 6, pack_gqa=True, num_splits=3)
    metadata = shim.get_scheduler_metadata(2, 1, 64, 4, 2, 128, torch.zeros(2))
    assert metadata is shim.NO_SCHEDULER_METADATA
    q, kc, vc, lens, _ = cache()
    shim.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, scheduler_metadata=metadata, pack_gqa=True)
    assert [c[0] for c in lib.calls] == ["attention", "varlen_attention", "attention_with_kvcache"]
    for _, _, kwargs in lib.calls:
        assert not {"pack_gqa", "sm_margin", "scheduler_metadata"} & set(kwargs)
    assert "num_splits" not in lib.calls[0][2] and "num_splits" not in lib.calls[1][2]


def test_bad_hint_mode_raises(lib, monkeypatch):
    monkeypatch.setenv("FLASHCORE_FA3_HINTS", "maybe")
    with pytest.raises(ValueError, match="FLASHCORE_FA3_HINTS"):
        shim.flash_attn_func(*qkv(), pack_gqa=True)


def test_varlen_equal_seqused_are_left_out(lib):
    q, k, v, cu_q, cu_k = packed()
    shim.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 6, seqused_q=torch.tensor([5, 7], dtype=torch.int32),
                                seqused_k=torch.tensor([4, 6], dtype=torch.int32), causal=True)
    (name, args, kwargs), = lib.calls
    assert name == "varlen_attention" and args[5:] == (7, 6) and args[3] is cu_q and args[4] is cu_k
    assert kwargs == dict(causal=True, softmax_scale=None, return_lse=False)


def test_varlen_partial_seqused_k_is_passed(lib):
    q, k, v, cu_q, cu_k = packed()
    used = torch.tensor([3, 6], dtype=torch.int32)
    out, lse = shim.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 6, seqused_k=used, return_attn_probs=True)
    (_, _, kwargs), = lib.calls
    assert kwargs["seqused_k"] is used and kwargs["return_lse"] is True
    assert lse.shape == (4, 12)


def test_kvcache_call(lib):
    q, kc, vc, lens, table = cache(page=16)
    k_new, v_new = (torch.randn(2, 1, 2, 128).to(BF16) for _ in range(2))
    out, lse, *rest = shim.flash_attn_with_kvcache(
        q, kc, vc, k_new, v_new, cache_seqlens=lens, page_table=table, rotary_seqlens=lens,
        rotary_interleaved=False, causal=True, num_splits=3, window_size=torch.tensor([10, 3]),
        return_softmax_lse=True)
    (name, args, kwargs), = lib.calls
    assert name == "attention_with_kvcache" and all(a is b for a, b in zip(args, (q, kc, vc)))
    assert kwargs == dict(k=k_new, v=v_new, cache_seqlens=lens, softmax_scale=None, causal=True,
                          return_softmax_lse=True, num_splits=3, window_size=(10, 3), block_table=table)
    assert rest == [] and lse.shape == (2, 4, 1)


def test_kvcache_serving_arguments_are_passed(lib):
    """FA3's cache_batch_idx, cache_leftpad (dense), packed queries and packed new keys reach
    flashcore.attention_with_kvcache as they are (FlashCore 0.8 takes them under FA3's names)."""
    q, kc, vc, lens, _ = cache()
    qp = q.reshape(2, 4, 128)
    idx, pad = torch.tensor([1, 0], dtype=torch.int32), torch.tensor([2, 0], dtype=torch.int32)
    cu_q, cu_new = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 2, 3], dtype=torch.int32)
    k_new, v_new = (torch.randn(3, 2, 128).to(BF16) for _ in range(2))
    out, lse = shim.flash_attn_with_kvcache(qp, kc, vc, k_new, v_new, cache_seqlens=lens, cache_batch_idx=idx,
                                           cache_leftpad=pad, cu_seqlens_q=cu_q, max_seqlen_q=1,
                                           cu_seqlens_k_new=cu_new, causal=True, return_softmax_lse=True)
    (name, args, kwargs), = lib.calls
    assert name == "attention_with_kvcache" and args[0] is qp
    assert all(kwargs[n] is t for n, t in (("cache_batch_idx", idx), ("cache_leftpad", pad), ("cu_seqlens_q", cu_q),
                                           ("cu_seqlens_k_new", cu_new), ("k", k_new), ("v", v_new)))
    assert kwargs["max_seqlen_q"] == 1 and "block_table" not in kwargs
    assert out.shape == (2, 4, 128) and lse.shape == (4, 2)
    q, kc, vc, lens, table = cache(page=16)  # paged: cache_batch_idx picks the page_table row
    shim.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, cache_batch_idx=idx)
    assert lib.calls[1][2]["cache_batch_idx"] is idx and lib.calls[1][2]["block_table"] is table
    shim.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table)  # none given: none passed
    assert not {"cache_batch_idx", "cache_leftpad", "cu_seqlens_q", "max_seqlen_q", "cu_seqlens_k_new"} & set(
        lib.calls[2][2])


def test_varlen_partial_seqused_q_is_passed(lib):
    """A seqused_q that leaves rows unused reaches flashcore.varlen_attention (0.8); under autograd the backward is
    probed with seqused_q (0.9's backward takes it), and a library that refuses it skips at the backward, naming
    seqused_q."""
    q, k, v, cu_q, cu_k = packed()
    used = torch.tensor([3, 7], dtype=torch.int32)
    shim.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 6, seqused_q=used, causal=True)
    (_, _, kwargs), = lib.calls
    assert kwargs["seqused_q"] is used and "seqused_k" not in kwargs
    for t in (q, k, v):
        t.requires_grad_()
    lib.answers["backward"] = "probe: RuntimeError: seqused_q is set"
    out = shim.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 6, seqused_q=used)
    backward_keys = [key for key in lib.probed if key[0] == "backward"]
    assert backward_keys and backward_keys[-1][-3:] == (False, True, False)  # seqused_k, seqused_q, deterministic
    with pytest.raises(SKIPPED, match=r"backward of flash_attn_varlen_func \(bfloat16, head_dim=64, seqused_q\) not "
                                      r"supported \(probe: RuntimeError: seqused_q is set\)"):
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


def test_varlen_partial_seqused_q_skips_with_an_older_library(lib):
    lib.serving = False
    q, k, v, cu_q, cu_k = packed()
    with pytest.raises(SKIPPED) as info:
        shim.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 6, seqused_q=torch.tensor([3, 7], dtype=torch.int32))
    assert info.value.msg.startswith("flashcore: seqused_q not supported (query rows past seqused_q[b] inside a "
                                     "sequence: the loaded libflashcore.so predates FlashCore 0.8's seqused_q)")
    assert lib.calls == []


@pytest.mark.parametrize("interleaved", [False, True])
def test_kvcache_rotary_is_passed(lib, interleaved):
    """rotary_cos / rotary_sin reach flashcore.attention_with_kvcache with rotary_interleaved and rotary_seqlens as
    FA3 got them (rotary_seqlens left out when None)."""
    q, kc, vc, lens, table = cache(page=16)
    k_new, v_new = (torch.randn(2, 1, 2, 128).to(BF16) for _ in range(2))
    cos, sin = torch.ones(64, 32).to(BF16), torch.zeros(64, 32).to(BF16)
    starts = torch.tensor([3, 9], dtype=torch.int32)
    shim.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                 page_table=table, rotary_seqlens=starts, rotary_interleaved=interleaved, causal=True)
    shim.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens)
    (_, _, first), (_, _, second) = lib.calls
    assert first["rotary_cos"] is cos and first["rotary_sin"] is sin and first["rotary_seqlens"] is starts
    assert first["rotary_interleaved"] is interleaved and first["block_table"] is table
    assert second["rotary_interleaved"] is True and "rotary_seqlens" not in second


@pytest.mark.parametrize("page", [1, 4, 24])
def test_kvcache_any_page_size_is_passed(lib, page):
    q, kc, vc, lens, _ = cache()
    pages = 48 // page
    kp, vp = (torch.randn(2 * pages, page, 2, 128).to(BF16) for _ in range(2))
    table = torch.arange(2 * pages, dtype=torch.int32).reshape(2, pages)
    shim.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens, page_table=table)
    (_, args, kwargs), = lib.calls
    assert args[1] is kp and kwargs["block_table"] is table


def test_kvcache_serving_arguments_skip_with_an_older_library(lib):
    """A library older than 0.8 (no serving fields): the call skips naming the argument; packed queries alone, which
    0.7's C ABI took on a cache, are passed on."""
    lib.serving = False
    q, kc, vc, lens, _ = cache()
    for kwargs, name in ((dict(cache_batch_idx=torch.tensor([1, 0], dtype=torch.int32)), "cache_batch_idx"),
                         (dict(cache_leftpad=torch.tensor([1, 0], dtype=torch.int32)), "cache_leftpad")):
        with pytest.raises(SKIPPED) as info:
            shim.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, **kwargs)
        assert info.value.msg == (f"flashcore: {name} not supported (the loaded libflashcore.so predates FlashCore "
                                  f"0.8's serving arguments)")
    k_new, v_new = (torch.randn(2, 1, 2, 128).to(BF16) for _ in range(2))
    with pytest.raises(SKIPPED) as info:
        shim.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, rotary_cos=torch.ones(64, 32).to(BF16),
                                     rotary_sin=torch.zeros(64, 32).to(BF16), cache_seqlens=lens)
    assert info.value.msg.startswith("flashcore: rotary embedding (rotary_cos / rotary_sin) not supported (the "
                                     "loaded libflashcore.so predates")
    q4, kp, vp, lens4, table = cache(page=4)
    with pytest.raises(SKIPPED) as info:
        shim.flash_attn_with_kvcache(q4, kp, vp, cache_seqlens=lens4, page_table=table)
    assert info.value.msg.startswith("flashcore: page_size=4 not supported (the loaded libflashcore.so predates "
                                     "FlashCore 0.8")
    assert lib.calls == []
    shim.flash_attn_with_kvcache(q.reshape(2, 4, 128), kc, vc, cache_seqlens=lens,
                                 cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32), max_seqlen_q=1)
    assert len(lib.calls) == 1


# ---------------------------------------------------------------------------------------------------------------
# FA3's hdimdiff cases: v with a head dim of its own (d = 192, dv = 128), FlashCore's head_dim_v.


def test_hdimdiff_reaches_flashcore_as_is(lib):
    """FA3's (d, dv) = (192, 128) reaches each front end with v (v_cache, v) of 128 columns, the variant probed with
    it; FlashCore's output has v's head dim."""
    q, k, v = qkv(d=192, dv=128)
    out = shim.flash_attn_func(q, k, v, causal=True, softcap=15.0)
    assert out.shape == (2, 8, 4, 128) and torch.equal(out, ref_attention(q, k, v, causal=True))
    qp, kp, vp, cu_q, cu_k = packed(d=192, dv=128)
    assert shim.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, 7, 6).shape == (12, 4, 128)
    qc, kc, vc, lens, table = cache(d=192, dv=128, page=16)
    k_new, v_new = torch.randn(2, 1, 2, 192).to(BF16), torch.randn(2, 1, 2, 128).to(BF16)
    assert shim.flash_attn_with_kvcache(qc, kc, vc, k_new, v_new, cache_seqlens=lens, page_table=table).shape == (
        2, 1, 4, 128)
    assert [(name, args[2].shape[-1]) for name, args, _ in lib.calls] == [
        ("attention", 128), ("varlen_attention", 128), ("attention_with_kvcache", 128)]
    assert lib.calls[2][2]["v"] is v_new and lib.calls[2][2]["block_table"] is table
    assert ("attention", "softcap", BF16, 192, 128, True) in lib.probed


def test_hdimdiff_without_the_pair_skips(lib):
    """A library that compiles no such pair (one older than 0.7 reports none) skips the call, naming the pair."""
    lib.head_dim_pairs = ()
    for call in (_dense(_qkv=dict(d=192, dv=128)), lambda: shim.flash_attn_varlen_func(
            *packed(d=192, dv=128), 7, 6)):
        with pytest.raises(SKIPPED, match=r"flashcore: head_dim_v != head_dim not supported \(\(head_dim, head_dim_v\) "
                                          r"= \(192, 128\) is not compiled into this library; compiled pairs: \[\]\)"):
            call()
    assert lib.calls == []


def test_hdimdiff_backward_skips_after_a_real_forward(lib):
    """A library whose backward lacks dv != d (before 0.9, or off the sm90 backend): the backward probe (v of 128
    columns) quotes its refusal, and the test skips when it asks for gradients, its forward passed on."""
    lib.answers["backward"] = ("probe: ValueError: FlashCore: flashcore_attention_backward_workspace_size failed: "
                               "head_dim_v = 128 differs from head_dim = 192")
    q, k, v = qkv(d=192, dv=128, requires_grad=True)
    out = shim.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out, ref_attention(q, k, v, causal=True)) and out.requires_grad
    assert ("backward", "attention", BF16, 192, 128, True, (), False, False, False) in lib.probed
    with pytest.raises(SKIPPED) as info:
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert info.value.msg == ("flashcore: backward of flash_attn_func (bfloat16, head_dim=192, head_dim_v=128) not "
                              "supported (probe: ValueError: FlashCore: flashcore_attention_backward_workspace_size "
                              "failed: head_dim_v = 128 differs from head_dim = 192)")


@pytest.mark.parametrize("d, dv", [(192, 128), (192, None), (96, None)], ids=["d192-dv128", "d192", "d96"])
@pytest.mark.parametrize("entry", ["flash_attn_func", "flash_attn_varlen_func"])
def test_backward_the_library_takes_keeps_its_graph(lib, entry, d, dv):
    """A library whose backward takes the call (0.9's sm90 backend: head dims 96 and 192, and dv = 128 under
    d = 192): the backward probe passes and FlashCore's own graph is returned, no skip at autograd.grad. Nothing is
    hard-coded: the probe, of the call's head dims, decides."""
    lib.head_dims = (64, 96, 128, 192, 256)
    if entry == "flash_attn_func":
        q, k, v = qkv(d=d, dv=dv, requires_grad=True)
        out = shim.flash_attn_func(q, k, v, causal=True)
        probed = ("backward", "attention", BF16, d, dv or d, True, (), False, False, False)
    else:
        q, k, v, cu_q, cu_k = packed(d=d, dv=dv)
        for t in (q, k, v):
            t.requires_grad_()
        out = shim.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 6, causal=True)
        probed = ("backward", "varlen_attention", BF16, d, dv or d, True, (), False, False, False)
    assert out.shape[-1] == (dv or d) and "SkipOnBackward" not in type(out.grad_fn).__name__
    assert probed in lib.probed
    if entry == "flash_attn_func":
        grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_hdimdiff_backward_probe_reaches_the_library(monkeypatch):
    """The real backward probe of dv != d (no stand-ins for the shim; FlashCore's ops with the library calls replaced
    on the CPU): it reaches the library's backward with dout of v's head dim and returns dv of v's shape, rather than
    being refused in Python. What the library answers is the probe's answer."""
    from flashcore import _ops

    class Caps:
        path = "<cpu stand-in>"

        @staticmethod
        def compiled():
            return ("float16", "bfloat16"), (64, 96, 128, 192, 256)

        @staticmethod
        def compiled_head_dim_pairs():
            return ((192, 128),)

    launched = []

    def launch(lib, q, k, v, out, lse, *args, **kwargs):
        out.zero_()
        if lse.numel():
            lse.zero_()

    def launch_backward(lib, dout, q, k, v, out, lse, dq, dk, dv, *args, **kwargs):
        launched.append((tuple(dout.shape), tuple(dv.shape)))
        for t in (dq, dk, dv):
            t.zero_()

    monkeypatch.setattr(_ops, "_check_device", lambda q, k, v: None)
    monkeypatch.setattr(_ops, "_check_supported", lambda q, head_dim, head_dim_v=None: Caps)
    monkeypatch.setattr(_ops, "_launch", launch)
    monkeypatch.setattr(_ops, "_launch_backward", launch_backward)
    monkeypatch.setattr(shim, "_PROBES", {})
    assert shim.probe("hdimdiff", shim._probe_call("attention", BF16, 192, True, "cpu", {}, backward=True,
                                                   head_dim_v=128)) is None
    assert launched == [((1, 32, 2, 128), (1, 32, 1, 128))]

    def refuse(*args, **kwargs):
        raise ValueError("FlashCore: flashcore_attention_backward_workspace_size failed: head_dim_v = 128 differs "
                         "from head_dim = 192: the backward takes one head dim for Q, K and V in this version")

    monkeypatch.setattr(_ops, "_launch_backward", refuse)
    answer = shim.probe("hdimdiff-refused", shim._probe_call("attention", BF16, 192, True, "cpu", {}, backward=True,
                                                             head_dim_v=128))
    assert answer.startswith("probe: ValueError: FlashCore: flashcore_attention_backward_workspace_size failed: "
                             "head_dim_v = 128 differs from head_dim = 192"), answer


@pytest.mark.parametrize("entry", ["attention", "varlen_attention", "attention_with_kvcache"])
def test_probe_calls_carry_head_dim_v(lib, entry):
    """A probe asks FlashCore about the call's v: its tiny call has v (and the cache's v) of head_dim_v columns (the
    stand-in for attention differentiates, so its backward probe runs too)."""
    shim._probe_call(entry, BF16, 192, True, "cpu", {}, backward=entry == "attention", head_dim_v=128)()
    (name, args, _), = lib.calls
    assert name == entry and args[0].shape[-1] == 192 and args[1].shape[-1] == 192 and args[2].shape[-1] == 128


# ---------------------------------------------------------------------------------------------------------------
# Backward.


def test_backward_flashcore_has_keeps_its_graph(lib):
    q, k, v = qkv(requires_grad=True)
    out = shim.flash_attn_func(q, k, v, causal=True)
    assert "SkipOnBackward" not in type(out.grad_fn).__name__
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    expected = torch.autograd.grad(ref_attention(q, k, v, causal=True), (q, k, v), g)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected))
    assert any(key[0] == "backward" for key in lib.probed)


def test_backward_flashcore_lacks_skips_after_a_real_forward(lib):
    lib.answers["backward"] = "probe: NotImplementedError: no backward here"
    q, k, v = qkv(d=256, requires_grad=True)
    out = shim.flash_attn_func(q, k, v, causal=True, softcap=15.0)
    assert torch.equal(out, ref_attention(q, k, v, causal=True))  # the stand-in's forward, passed on as it is
    assert out.requires_grad
    with pytest.raises(SKIPPED) as info:
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert info.value.msg == ("flashcore: backward of flash_attn_func (bfloat16, head_dim=256, softcap) not "
                              "supported (probe: NotImplementedError: no backward here)")


def test_backward_varlen_with_seqused_k_is_probed_as_such(lib):
    lib.answers["backward"] = "probe: NotImplementedError: seqused_k"
    q, k, v, cu_q, cu_k = packed()
    for t in (q, k, v):
        t.requires_grad_()
    out = shim.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 6, seqused_k=torch.tensor([3, 6], dtype=torch.int32))
    backward_keys = [key for key in lib.probed if key[0] == "backward"]
    assert backward_keys and backward_keys[-1][-3:] == (True, False, False)  # seqused_k, seqused_q, deterministic
    with pytest.raises(SKIPPED, match=r"backward of flash_attn_varlen_func \(bfloat16, head_dim=64, seqused_k\)"):
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


def test_no_grad_no_backward_probe(lib):
    shim.flash_attn_func(*qkv())
    with torch.no_grad():
        shim.flash_attn_func(*qkv(requires_grad=True))
    assert not any(key[0] == "backward" for key in lib.probed)


# ---------------------------------------------------------------------------------------------------------------
# Without stand-ins: a supported call ends in FlashCore's own error here (no GPU), never in a skip.


def test_supported_call_reaches_flashcore_without_a_gpu(monkeypatch):
    monkeypatch.setattr(shim, "compiled_head_dims", lambda: (64, 128, 256))
    monkeypatch.setattr(shim, "compiled_dtypes", lambda: ("float16", "bfloat16"))
    monkeypatch.setattr(shim, "compiled_head_dim_pairs", lambda: ((192, 128),))
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        shim.flash_attn_func(*qkv())
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        shim.flash_attn_func(*qkv(d=192, dv=128))
    q, k, v, cu_q, cu_k = packed()
    with pytest.raises(ValueError, match="CUDA"):
        shim.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 6)


def test_library_question_is_not_turned_into_a_skip(monkeypatch):
    def no_library():
        raise RuntimeError("no libflashcore.so here")

    monkeypatch.setattr(shim, "capabilities", no_library)
    with pytest.raises(RuntimeError, match="no libflashcore.so"):
        shim.flash_attn_func(*qkv())


def test_probe_caches_and_quotes_the_error(monkeypatch):
    monkeypatch.setattr(shim, "_PROBES", {})
    count = []

    def failing():
        count.append(1)
        raise ValueError("FlashCore: head_dim 96 is not compiled\nsecond line")

    assert shim.probe("k1", failing) == "probe: ValueError: FlashCore: head_dim 96 is not compiled"
    assert shim.probe("k1", failing) == "probe: ValueError: FlashCore: head_dim 96 is not compiled"
    assert shim.probe("k2", lambda: None) is None
    assert len(count) == 1


# ---------------------------------------------------------------------------------------------------------------
# The plugin's helpers.


def test_select_parsing_and_matching():
    clauses = plugin.parse_select("dtype=bfloat16|float16, d=128,causal=True")
    assert clauses == [("dtype", {"bfloat16", "float16"}), ("d", {"128"}), ("causal", {"True"})]
    assert plugin.matches({"dtype": torch.bfloat16, "d": 128, "causal": True, "x": 1}, clauses)
    assert not plugin.matches({"dtype": torch.float8_e4m3fn, "d": 128, "causal": True}, clauses)
    assert plugin.matches({"dtype": torch.float16}, clauses)  # a parameter the test lacks does not filter it
    with pytest.raises(ValueError):
        plugin.parse_select("dtype")


def test_sampling_is_deterministic_and_about_one_in_n():
    names = [f"test_x[{i}-{j}-bf16]" for i in range(100) for j in range(50)]
    kept = [n for n in names if plugin.sampled(n, 16)]
    assert kept == [n for n in names if plugin.sampled(n, 16)]
    assert 0.8 * len(names) / 16 < len(kept) < 1.2 * len(names) / 16
    other = [n for n in names if plugin.sampled(n, 16, seed="1")]
    assert other != kept
    assert all(plugin.sampled(n, 1) for n in names[:10])


def test_sample_spec():
    assert plugin.parse_sample("") == {"*": 1}
    assert plugin.parse_sample("8") == {"*": 8}
    assert plugin.parse_sample("test_a=4,test_b=16,2") == {"*": 2, "test_a": 4, "test_b": 16}
    with pytest.raises(ValueError):
        plugin.parse_sample("test_a=0")


def test_interleave_takes_turns():
    class Item:
        def __init__(self, fn, i):
            self.nodeid, self.name = f"f.py::{fn}[{i}]", f"{fn}[{i}]"

    items = [Item("test_a", i) for i in range(6)] + [Item("test_b", i) for i in range(3)]
    order = plugin.interleave(items)
    assert sorted(it.nodeid for it in order) == sorted(it.nodeid for it in items)
    assert [plugin.function_of(it.nodeid) for it in order[:6]] == ["test_a", "test_b"] * 3
    assert order == plugin.interleave(list(reversed(items)))


def test_skip_reasons():
    assert plugin.skip_reason(("f.py", 3, "Skipped: flashcore: qv not supported")) == "flashcore: qv not supported"
    assert plugin.skip_source("flashcore: qv not supported") == "shim"
    assert plugin.skip_source(plugin.NO_CUDA_REASON) == "plugin"
    assert plugin.skip_source("Has Qv requires hdim 64") == "fa3"
    assert plugin.skip_reason(("f.py", 3, "Skipped")) == plugin.NO_REASON
    assert plugin.skip_source(plugin.NO_REASON) == "fa3"


# ---------------------------------------------------------------------------------------------------------------
# FA3's own module, collected through the plugin (needs the fetched files).

needs_fa3 = pytest.mark.skipif(not (FA3_DIR / "test_flash_attn.py").is_file(),
                               reason=f"FA3's test files are not in {FA3_DIR} (see tests/fa3_compat/README.md)")
KEYWORD = "test_flash_attn_output or test_flash_attn_varlen_output or test_flash_attn_kvcache"


def _pytest(args, env_extra, tmp_path, prelude=""):
    pytest.importorskip("einops", reason="FA3's tests import einops")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASH_ATTENTION_", "FLASHCORE_FA3_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(HERE), str(REPO_ROOT / "python"), str(FA3_DIR)]),
               FLASHCORE_FA3_SUMMARY=str(tmp_path / "summary.txt"), **env_extra)
    code = f"import sys, pytest\n{prelude}\nsys.exit(pytest.main(sys.argv[1:]))"
    run = subprocess.run([sys.executable, "-c", code, str(FA3_DIR / "test_flash_attn.py"), "-p", "fa3_plugin",
                          "-p", "no:cacheprovider", "-q", f"--rootdir={REPO_ROOT}", *args],
                         env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    return run


@needs_fa3
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the collection-only behaviour of a machine without GPU")
def test_fa3_module_collects_and_nothing_passes_without_a_gpu(tmp_path):
    # tools/run_fa3_tests.sh's flags: FA3's local tests (window_size, attention_chunk) on, its split and PackGQA off.
    flags = dict(FLASH_ATTENTION_DISABLE_LOCAL="FALSE", FLASH_ATTENTION_DISABLE_SPLIT="TRUE",
                 FLASH_ATTENTION_DISABLE_PACKGQA="TRUE")
    run = _pytest(["--collect-only", "-k", KEYWORD], dict(flags, FLASHCORE_FA3_SAMPLE="16"), tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads((tmp_path / "summary.txt.json").read_text())
    tests = data["tests"]
    for fn in ("test_flash_attn_output", "test_flash_attn_varlen_output", "test_flash_attn_kvcache"):
        t = tests[fn]
        assert t["after -k"] == t["collected in file"] > 1000, (fn, t)
        assert 0.8 * t["selected"] / 16 < t["sampled"] < 1.2 * t["selected"] / 16, (fn, t)
    assert tests["test_flash_attn_combine"]["after -k"] == 0
    assert data["settings"]["FA3 flags"] == flags

    # A few real items: each skipped for want of a GPU, none passed.
    select = "seqlen_q=113,seqlen_k=203,d=128,softcap=0.0,has_qv=False,mha_type=gqa,dtype=bfloat16"
    run = _pytest(["-k", "test_flash_attn_output", "-rs"], dict(flags, FLASHCORE_FA3_SELECT=select), tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    t = json.loads((tmp_path / "summary.txt.json").read_text())["tests"]["test_flash_attn_output"]
    assert t["ran"] == t["skipped"] == 4 and t["passed"] == 0  # causal False / True x local False / True
    assert list(t["skips"]) == [plugin.NO_CUDA_REASON]


@needs_fa3
def test_plugin_refuses_another_flash_attn_interface(tmp_path):
    prelude = "import types; sys.modules['flash_attn_interface'] = types.ModuleType('flash_attn_interface')"
    run = _pytest(["--collect-only", "-k", "test_flash_attn_output"], {}, tmp_path, prelude=prelude)
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "not FlashCore's shim" in run.stdout + run.stderr
