"""The backward (since 0.4) without a GPU: the ctypes mirror of its fields and functions (against the header and a
host-only stub library), the custom ops' registration (flashcore::attention_bwd, the autograd formulas, fake tensors,
opcheck), and the autograd wiring of flashcore.attention / flashcore.sdpa with the kernels emulated on the CPU
(reference.emulate_on_cpu: the backward by backward_fp64, the kernel's formulas in float64), against float64 autograd.

Since 0.6 also the variants' backward through the stub: window, softcap, sinks and the dsinks pointer as
flashcore_attention_backward receives them from flashcore.attention / sdpa / varlen_attention, and a 0.5-sized stub
(whose backward does not take them) refused with RuntimeError naming the version.

The kernel itself runs in test_backward_gpu.py (and the variants' in test_variants_backward_gpu.py). Needs torch (the mirror's layout is also checked without it, by
test_abi.py)."""

import ctypes
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from conftest import build_stub  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from reference import attention_autograd, emulate_on_cpu, reference_grads  # noqa: E402
from test_abi import parse_struct  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

# ---------------------------------------------------------------------------------------------------------------
# The C ABI's backward fields and functions.

# Sizes and alignments of the header's field types on the 64-bit ABIs FlashCore targets (LP64).
_C_LAYOUT = {"uint32_t": (4, 4), "int32_t": (4, 4), "float": (4, 4), "flashcore_dtype": (4, 4), "uint64_t": (8, 8),
             "int64_t": (8, 8), "flashcore_tensor_strides": (32, 8)}


def _header_layout(header_text):
    """{field: offset} and sizeof of flashcore_attention_params, laid out from the header's declarations with the
    C alignment rules (independent of ctypes and of a C compiler)."""
    offsets, offset, struct_align = {}, 0, 1
    for field, ctype, pointer, length in parse_struct(header_text, "flashcore_attention_params"):
        assert length is None, field
        size, align = (8, 8) if pointer else _C_LAYOUT[ctype]
        offset = (offset + align - 1) // align * align
        offsets[field] = offset
        offset += size
        struct_align = max(struct_align, align)
    return offsets, (offset + struct_align - 1) // struct_align * struct_align


def test_params_layout_matches_header(header_text):
    """dout starts where the 0.3 layout ends (480); then 4 pointers, 4 stride structs and 2 int32: the 0.4 layout,
    648 bytes; the 0.5 variants follow (4 int32/float, a pointer, 2 int32): 680 bytes; then the 0.6 dsinks pointer:
    688 bytes; then the 0.7 head_dim_v (int64): 696 bytes; then the 0.8 serving fields (a pointer, an int64, two
    pointers, an int64, the seqused_q pointer, two rotary pointers, an int64, two int32 and a pointer): 784 bytes."""
    offsets, size = _header_layout(header_text)
    assert offsets["dout"] == 480 == _lib.ATTENTION_PARAMS_V3_SIZE
    assert offsets["local"] == 480 + 4 * 8 + 4 * 32 + 2 * 4 == 648 == _lib.ATTENTION_PARAMS_V4_SIZE
    assert offsets["dsinks"] == 648 + 4 * 4 + 8 + 2 * 4 == 680 == _lib.ATTENTION_PARAMS_V5_SIZE
    assert offsets["head_dim_v"] == 680 + 8 == 688 == _lib.ATTENTION_PARAMS_V6_SIZE
    assert offsets["kv_batch_idx"] == 688 + 8 == 696 == _lib.ATTENTION_PARAMS_V7_SIZE
    assert offsets["seqused_q"] == 696 + 5 * 8 == 736
    assert {name: offsets[name] for name in ("rotary_cos", "rotary_sin", "rotary_seqlen", "rotary_dim",
                                             "rotary_interleaved", "rotary_seqlens")} == {
        "rotary_cos": 744, "rotary_sin": 752, "rotary_seqlen": 760, "rotary_dim": 768, "rotary_interleaved": 772,
        "rotary_seqlens": 776}
    assert size == 736 + 8 + 2 * 8 + 8 + 2 * 4 + 8 == 784
    assert ctypes.sizeof(_lib.AttentionParamsStruct) == size
    assert [name for name, _ in _lib.AttentionParamsStruct._fields_] == list(offsets)
    for name, offset in offsets.items():
        assert getattr(_lib.AttentionParamsStruct, name).offset == offset, name
    expected = {"dout": 480, "dq": 488, "dk": 496, "dv": 504, "dout_strides": 512, "dq_strides": 544,
                "dk_strides": 576, "dv_strides": 608, "deterministic": 640, "reserved3": 644}
    assert {name: offsets[name] for name in expected} == expected


def test_fill_backward_params():
    params = _lib.AttentionParamsStruct()
    _lib.fill_backward_params(params, pointers=(0x100, 0x200, 0x300, 0x400),
                              strides=((1, 2, 3, 1), (4, 5, 6, 1), (7, 8, 9, 1), (10, 11, 12, 1)), deterministic=True)
    assert (params.dout, params.dq, params.dk, params.dv, params.deterministic) == (0x100, 0x200, 0x300, 0x400, 1)
    assert (params.dq_strides.batch, params.dk_strides.seq, params.dv_strides.head) == (4, 8, 12)
    _lib.fill_backward_params(params, pointers=(0, 0, 0, 0), strides=((0, 0, 0, 1),) * 4, deterministic=False)
    assert (params.dout, params.deterministic) == (None, 0)


def _backward_params(lib):
    params = _lib.fill_params(lib.new_params(), pointers=(0x1000, 0x2000, 0x3000, 0x4000, 0x5000),
                              strides=((8192, 512, 64, 1),) * 4, sizes=(2, 3, 5, 8, 2, 64), dtype=_lib.DTYPE_BF16,
                              causal=True, softmax_scale=0.25)
    return _lib.fill_backward_params(params, pointers=(0x6000, 0x7000, 0x8000, 0x9000),
                                     strides=((1024, 256, 32, 1), (8192, 512, 64, 1), (640, 128, 64, 1),
                                              (640, 128, 64, 1)), deterministic=True)


def test_backward_reaches_c_intact(use_library, stub_library):
    use_library(stub_library)
    lib = _lib.load()
    assert lib.has_backward()
    params = _backward_params(lib)
    assert lib.backward_workspace_size(params) == (4 * 64 + 8) * 2 * 8 * 3  # the stub's: the header's estimate
    lib.backward(params, 0xABC0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_backward_params(ctypes.byref(seen))
    lib._cdll.stub_last_backward_stream.restype = ctypes.c_void_p
    assert lib._cdll.stub_last_backward_stream() == 0xABC0
    assert ctypes.string_at(ctypes.addressof(seen), ctypes.sizeof(seen)) == ctypes.string_at(
        ctypes.addressof(params), ctypes.sizeof(params))
    assert (seen.dout, seen.dq, seen.dk, seen.dv, seen.deterministic) == (0x6000, 0x7000, 0x8000, 0x9000, 1)
    assert (seen.dout_strides.head, seen.dk_strides.batch, seen.lse, seen.causal) == (32, 640, 0x5000, 1)


def test_backward_failure_raises_with_last_error(use_library, stub_library):
    use_library(stub_library)
    lib = _lib.load()
    params = _backward_params(lib)
    params.head_dim = 1000 + _lib.ERROR_UNSUPPORTED_HEAD_DIM
    with pytest.raises(ValueError, match=r"flashcore_attention_backward failed: stub failure with status 5"):
        lib.backward(params, 0)


@pytest.fixture
def stub_v3_library(c_compiler, header_text, tmp_path):
    """The stub playing a 0.3 library: struct_size 480, no backward functions."""
    return build_stub(c_compiler, tmp_path, "libflashcore_v3.so",
                      "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V3_SIZE", "-DSTUB_NO_BACKWARD")


def test_library_without_backward(use_library, stub_v3_library):
    """A 0.3 library loads (struct_size 480, the mirror's prefix; nothing written past it), runs the forward, and its
    missing backward is a RuntimeError naming the function."""
    use_library(stub_v3_library)
    lib = _lib.load()
    assert lib.params_struct_size == _lib.ATTENTION_PARAMS_V3_SIZE
    assert lib.has_params_field("reserved2") and not lib.has_params_field("dout")
    assert not lib.has_backward()
    params = lib.new_params()
    assert params.struct_size == _lib.ATTENTION_PARAMS_V3_SIZE
    for call in (lambda: lib.backward(params, 0), lambda: lib.backward_workspace_size(params)):
        with pytest.raises(RuntimeError, match=r"has no flashcore_attention_backward\w*; a newer library is needed"):
            call()


def test_exported_backward_with_an_old_struct_is_refused(use_library, c_compiler, header_text, tmp_path):
    """Functions present but a 0.3-sized struct (a mismatched build): refused, never handed fields past its size."""
    use_library(build_stub(c_compiler, tmp_path, "libflashcore_v3b.so",
                           "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V3_SIZE"))
    lib = _lib.load()
    assert not lib.has_backward()
    with pytest.raises(RuntimeError, match="has no backward fields"):
        lib.backward(lib.new_params(), 0)


# ---------------------------------------------------------------------------------------------------------------
# The ops: registration, fake tensors, opcheck.

BF16_TOL = dict(atol=2e-2, rtol=2e-2)  # bf16 rounding of gradients of magnitude ~1, against float64


@pytest.fixture
def emulated(monkeypatch):
    emulate_on_cpu(monkeypatch)


def _qkv(b=2, sq=17, sk=33, hq=4, hkv=2, d=64, dtype=torch.bfloat16, requires_grad=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, s, h, d, generator=gen).to(dtype).requires_grad_(requires_grad)
                 for s, h in ((sq, hq), (sk, hkv), (sk, hkv)))


def test_backward_op_is_registered():
    schema = torch.ops.flashcore.attention_bwd.default._schema
    assert [a.name for a in schema.arguments] == ["dout", "q", "k", "v", "out", "lse", "causal", "softmax_scale",
                                                  "deterministic"]
    assert [str(r.type) for r in schema.returns] == ["Tensor"] * 3
    assert not any(a.alias_info for a in schema.arguments)  # mutates nothing
    fwd = {a.name: a for a in torch.ops.flashcore.attention_fwd.default._schema.arguments}
    assert fwd["deterministic"].default_value is False


@pytest.mark.parametrize("op", ["attention_fwd", "varlen_attention_fwd", "attention_kvcache_fwd"])
def test_forward_ops_have_an_autograd_kernel(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"flashcore::{op}", "Autograd")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_backward_fake_propagation(dtype):
    """Shapes, dtypes, devices and layouts of dq, dk, dv under FakeTensorMode (fake CUDA tensors, no GPU needed):
    the layout of q, k, v where the ABI takes it, else contiguous."""
    with FakeTensorMode():
        q = torch.empty(2, 8, 17, 64, dtype=dtype, device="cuda").transpose(1, 2)  # sdpa's (B, H, S, D) viewed
        k = torch.empty(2, 33, 6, 64, dtype=dtype, device="cuda")[:, :, 1:3]  # a head slice: not dense
        v = torch.empty(2, 33, 2, 64, dtype=dtype, device="cuda")
        dout = torch.empty(2, 17, 8, 64, dtype=dtype, device="cuda")
        lse = torch.empty(2, 8, 17, device="cuda")
        dq, dk, dv = torch.ops.flashcore.attention_bwd(dout, q, k, v, dout, lse, True, 0.0, True)
        for grad, like in ((dq, q), (dk, k), (dv, v)):
            assert grad.shape == like.shape and grad.dtype == dtype and grad.device.type == "cuda"
        assert dq.stride() == q.stride() and dv.stride() == v.stride()
        assert dk.is_contiguous()
        with pytest.raises(ValueError, match="lse must be the forward's float32"):
            torch.ops.flashcore.attention_bwd(dout, q, k, v, dout, lse[:, :4], True, 0.0, False)
        with pytest.raises(ValueError, match="dout must have q's shape and dtype"):
            torch.ops.flashcore.attention_bwd(dout[:, :3], q, k, v, dout, lse, True, 0.0, False)


def test_opcheck_backward_op(emulated):
    """torch.library.opcheck of flashcore::attention_bwd with the kernel emulated on the CPU (the real op needs a GPU
    and a 0.4 library)."""
    q, k, v = _qkv(requires_grad=False)
    out, lse = _ops.attention_fwd(q, k, v, True, 0.0, True)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flashcore.attention_bwd.default, (dout, q, k, v, out, lse, True, 0.0, False))
    torch.library.opcheck(torch.ops.flashcore.attention_bwd.default, (dout, q, k, v, out, lse, False, 0.3, True))


@pytest.mark.parametrize("return_lse", [True, False])
def test_opcheck_forward_autograd(emulated, return_lse):
    """opcheck of the forward op with inputs that require grad: the autograd registration and AOT dispatch (which
    traces the backward); return_lse=False is the direct op call whose backward recomputes lse."""
    q, k, v = _qkv()
    torch.library.opcheck(torch.ops.flashcore.attention_fwd.default, (q, k, v, True, 0.0, return_lse))


# ---------------------------------------------------------------------------------------------------------------
# Gradients through flashcore.attention / flashcore.sdpa (kernels emulated) against float64 autograd.


def _check_grads(got, want, tol=BF16_TOL):
    for name, g, w in zip("qkv", got, want):
        assert g is not None, f"d{name} missing"
        torch.testing.assert_close(g.double(), w, **tol, msg=lambda m: f"d{name}: {m}")


CASES = [  # (b, sq, sk, hq, hkv, d, causal)
    (2, 17, 17, 4, 4, 64, False),
    (2, 17, 33, 4, 2, 64, True),  # GQA, Sq < Sk
    (1, 40, 16, 8, 1, 128, True),  # MQA, Sq > Sk: the first 24 rows see no key
    (2, 1, 113, 4, 2, 128, False),
    (1, 113, 1, 2, 2, 64, False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}-sq{}-sk{}-hq{}-hkv{}-d{}-{}".format(
    *c[:6], "causal" if c[6] else "full"))
def test_attention_grads(emulated, case):
    b, sq, sk, hq, hkv, d, causal = case
    q, k, v = _qkv(b, sq, sk, hq, hkv, d)
    out = flashcore.attention(q, k, v, causal=causal)
    dout = torch.randn_like(out)
    out.backward(dout)
    _check_grads((q.grad, k.grad, v.grad), reference_grads(q, k, v, dout, causal))
    for t in (q, k, v):
        assert t.grad.dtype == t.dtype and t.grad.stride() == t.stride()


def test_grads_through_lse(emulated):
    """A loss on out and lse (e.g. merging partial results): the gradient through lse reaches q and k; none of the
    others. Rows without keys (lse = -inf) pass nothing."""
    q, k, v = _qkv(1, 40, 16, 4, 2, 64)
    out, lse = flashcore.attention(q, k, v, causal=True, softmax_scale=0.2, return_lse=True)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    torch.autograd.backward([out, lse], [dout, dlse])
    _check_grads((q.grad, k.grad, v.grad), reference_grads(q, k, v, dout, True, 0.2, dlse=dlse))
    for t in (q, k, v):
        t.grad = None
    _, lse = flashcore.attention(q, k, v, causal=True, softmax_scale=0.2, return_lse=True)
    lse[torch.isfinite(lse)].sum().backward()  # lse alone
    want = reference_grads(q, k, v, torch.zeros(q.shape), True, 0.2, dlse=torch.ones(lse.shape))
    _check_grads((q.grad, k.grad, v.grad), want)
    assert torch.all(v.grad == 0)


def test_sdpa_grads_and_layout(emulated):
    """sdpa's (B, H, S, D) tensors: gradients in the same layout; GQA; scale; a strided, non-contiguous grad_out."""
    q, k, v = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in _qkv(2, 33, 33, 8, 2, 64))
    out = flashcore.sdpa(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    dout = torch.randn(2, 33, 8, 128, dtype=q.dtype)[..., ::2].transpose(1, 2)  # last-dim stride 2
    out.backward(dout)
    want = reference_grads(*(t.transpose(1, 2) for t in (q, k, v)), dout.transpose(1, 2), True, 0.3)
    _check_grads((q.grad, k.grad, v.grad), [w.transpose(1, 2) for w in want])
    for t in (q, k, v):
        assert t.grad.is_contiguous()  # (B, H, S, D)-contiguous, as the inputs


def test_non_contiguous_inputs_and_grad_out(emulated):
    q, k, v = _qkv(2, 21, 21, 4, 4, 64)
    qkv = torch.cat([q, k, v], dim=2).detach().requires_grad_()  # (B, S, 3H, D): head slices
    out = flashcore.attention(qkv[:, :, :4], qkv[:, :, 4:8], qkv[:, :, 8:], causal=True)
    dout = torch.randn(2, 4, 21, 64, dtype=out.dtype).transpose(1, 2)  # (B, H, S, D) storage
    out.backward(dout)
    want = reference_grads(q, k, v, dout, True)
    _check_grads(qkv.grad.split(4, dim=2), want)


def test_only_some_inputs_require_grad(emulated):
    q, k, v = _qkv()
    k.requires_grad_(False)
    out = flashcore.attention(q, k, v, causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    assert k.grad is None
    want = reference_grads(q, k, v, dout, True)
    torch.testing.assert_close(q.grad.double(), want[0], **BF16_TOL)
    torch.testing.assert_close(v.grad.double(), want[2], **BF16_TOL)


def test_direct_op_without_lse_recomputes_it(emulated):
    """torch.ops.flashcore.attention_fwd(..., return_lse=False) on inputs that require grad: the backward gets lse
    by running the forward again."""
    q, k, v = _qkv()
    out, lse = _ops.attention_fwd(q, k, v, True, 0.0, False)
    assert lse.shape == (0,)
    dout = torch.randn_like(out)
    out.backward(dout)
    _check_grads((q.grad, k.grad, v.grad), reference_grads(q, k, v, dout, True))


def test_front_ends_ask_for_lse_only_when_differentiated(emulated, monkeypatch):
    calls = []
    real = _ops.attention_fwd

    def spy(*args, **kwargs):
        calls.append((args[5], kwargs.get("deterministic", False)))
        return real(*args, **kwargs)

    monkeypatch.setattr(_ops, "attention_fwd", spy)
    q, k, v = _qkv(requires_grad=False)
    flashcore.attention(q, k, v)
    q.requires_grad_()
    with torch.no_grad():
        flashcore.attention(q, k, v)
    flashcore.attention(q, k, v, deterministic=True)
    flashcore.sdpa(*(t.transpose(1, 2) for t in (q, k, v)), deterministic=True)
    assert calls == [(False, False), (False, False), (True, True), (True, True)]


@pytest.mark.parametrize("front_end", ["attention", "sdpa"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_reaches_the_backward(emulated, monkeypatch, front_end, deterministic):
    seen = []
    real = _ops._launch_backward

    def spy(*args):
        seen.append(args[-1])
        return real(*args)

    monkeypatch.setattr(_ops, "_launch_backward", spy)
    q, k, v = _qkv()
    if front_end == "attention":
        out = flashcore.attention(q, k, v, causal=True, deterministic=deterministic)
    else:
        out = flashcore.sdpa(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True, deterministic=deterministic)
    out.float().sum().backward()
    assert seen == [deterministic]
    with pytest.raises(ValueError, match="deterministic must be a bool"):
        flashcore.attention(q, k, v, deterministic=2)


def test_empty_inputs(emulated):
    q, k, v = _qkv(sq=0)
    flashcore.attention(q, k, v).sum().backward()
    assert q.grad.shape == q.shape and torch.all(k.grad == 0) and torch.all(v.grad == 0)
    q, k, v = _qkv(sk=0)
    flashcore.attention(q, k, v).float().sum().backward()
    assert torch.all(q.grad == 0) and k.grad.shape == k.shape


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_backward(emulated, backend, dynamic):
    """torch.compile(fullgraph=True) of a function calling flashcore.attention, then .backward(): the joint graph
    traces the backward op (fake), and the gradients equal eager's."""
    torch._dynamo.reset()

    def loss(q, k, v, dout):
        return (flashcore.attention(q, k, v, causal=True, deterministic=True).float() * dout).sum()

    compiled = torch.compile(loss, fullgraph=True, backend=backend, dynamic=dynamic)
    for sq in (17, 29):
        q, k, v = _qkv(sq=sq, sk=sq)
        dout = torch.randn(q.shape)
        compiled(q, k, v, dout).backward()
        got = [t.grad for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        loss(q, k, v, dout).backward()
        for g, t in zip(got, (q, k, v)):
            torch.testing.assert_close(g, t.grad, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Calls without a backward yet: a clear NotImplementedError when .backward() reaches them (eager and compiled).


def _varlen_call(q, k, v):
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    used = torch.tensor([5, 6], dtype=torch.int32)  # seqused_k: sequence 1 uses 6 of its 7 keys
    return flashcore.varlen_attention(q, k, v, cu, cu, 7, 7, seqused_k=used)


@pytest.fixture
def emulated_serving(monkeypatch):
    from test_varlen_cpu import emulate_serving_on_cpu

    emulate_on_cpu(monkeypatch)
    emulate_serving_on_cpu(monkeypatch)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_varlen_backward_with_seqused_k(emulated_serving, compiled):
    """Since 0.9 the backward takes seqused_k (eager and compiled): sequence 1's unused key gets zero gradients, the
    rest those of its first 6 keys alone."""
    q, k, v = (t[0].detach().requires_grad_() for t in _qkv(1, 12, 12, 4, 2, 64))  # (total, H, D)
    fn = _varlen_call
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(_varlen_call, backend="aot_eager", fullgraph=True)
    out = fn(q, k, v)
    out.float().sum().backward()
    assert torch.count_nonzero(k.grad[11]) == 0 and torch.count_nonzero(v.grad[11]) == 0
    assert torch.count_nonzero(k.grad[10]) > 0 and torch.count_nonzero(q.grad[5:12]) > 0


def test_kvcache_backward_is_not_supported(emulated_serving):
    q = torch.randn(2, 3, 4, 64, dtype=torch.bfloat16, requires_grad=True)
    cache = torch.randn(2, 16, 2, 64, dtype=torch.bfloat16)
    out = flashcore.attention_with_kvcache(q, cache, cache, cache_seqlens=torch.tensor([5, 9], dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="backward of KV-cache attention .* is not supported yet"):
        out.float().sum().backward()


def test_fp8_backward_is_not_supported(emulated):
    q, k, v = _qkv(d=128)
    out = flashcore.attention(q, k, v, precision="fp8")
    with pytest.raises(NotImplementedError, match="backward of precision='fp8' attention is not supported yet"):
        out.float().sum().backward()
    with torch.no_grad():
        assert flashcore.attention(q, k, v, precision="fp8").shape == q.shape


# ---------------------------------------------------------------------------------------------------------------
# The op's C params (the host-only stub library records what the backward receives).


def test_backward_params(use_library, stub_library):
    use_library(stub_library)
    lib = _lib.load()
    q, k, v = _qkv(2, 17, 33, 8, 2, 64, requires_grad=False)
    out = torch.empty_like(q)
    lse = torch.empty(2, 8, 17)
    dout = torch.empty(2, 8, 17, 64, dtype=q.dtype).transpose(1, 2)  # (B, H, S, D) storage: passed as it is
    dq, dk, dv = (_ops._grad_like(t) for t in (q, k, v))
    params = _ops.backward_params(lib, dout, q, k, v, out, lse, dq, dk, dv, True, 0.125, True)
    assert lib.backward_workspace_size(params) == (4 * 64 + 8) * 2 * 8 * 17
    lib.backward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_backward_params(ctypes.byref(seen))
    assert (seen.dout, seen.dq, seen.dk, seen.dv) == tuple(t.data_ptr() for t in (dout, dq, dk, dv))
    assert (seen.q, seen.k, seen.v, seen.o, seen.lse) == tuple(t.data_ptr() for t in (q, k, v, out, lse))
    got = [(s.batch, s.seq, s.head, s.dim) for s in (seen.dout_strides, seen.dq_strides, seen.dk_strides,
                                                      seen.dv_strides)]
    assert got == [dout.stride(), dq.stride(), dk.stride(), dv.stride()]
    assert dout.stride() == (17 * 8 * 64, 64, 17 * 64, 1)
    assert (seen.batch, seen.seqlen_q, seen.seqlen_k, seen.num_heads_q, seen.num_heads_kv, seen.head_dim) == (
        2, 17, 33, 8, 2, 64)
    assert (seen.causal, seen.softmax_scale, seen.deterministic, seen.lse_capacity) == (1, 0.125, 1, 2 * 8 * 17)
    assert (seen.dtype, seen.out_dtype, seen.precision, seen.reserved3) == (_lib.DTYPE_BF16, _lib.DTYPE_SAME, 0, 0)


def test_op_with_a_library_without_backward(use_library, stub_v3_library, monkeypatch):
    """The op on a 0.3 library: RuntimeError naming flashcore_attention_backward, before any device work."""
    use_library(stub_v3_library)
    monkeypatch.setattr(_ops, "_check_device", lambda q, k, v: None)
    q, k, v = _qkv(requires_grad=False)
    out, lse = torch.empty_like(q), torch.zeros(2, 4, 17)
    with pytest.raises(RuntimeError, match="has no flashcore_attention_backward .*0.4 library or newer"):
        _ops.attention_bwd(torch.ones_like(q), q, k, v, out, lse, False, 0.0)


def test_reference_grads_agree():
    """The emulation's backward formulas (backward_fp64) and float64 autograd (reference_grads), which the tests above
    compare: two independent derivations agree, rows without keys included."""
    from reference import backward_fp64

    q, k, v = _qkv(2, 40, 16, 6, 2, 64, dtype=torch.float64, requires_grad=False)
    dout = torch.randn(q.shape, dtype=torch.float64)
    for causal in (False, True):
        for got, want in zip(backward_fp64(q, k, v, dout, causal, 0.3), reference_grads(q, k, v, dout, causal, 0.3)):
            torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    out, lse = attention_autograd(q, k, v, True)
    assert torch.all(out[:, :24] == 0) and torch.all(torch.isneginf(lse[:, :, :24]))
    assert not math.isnan(out.sum().item())


# ---------------------------------------------------------------------------------------------------------------
# The variants' backward (since 0.6): what flashcore_attention_backward receives, through the whole path (front end,
# autograd formula, attention_variants_bwd / varlen_attention_variants_bwd, the C params), recorded by the host-only
# stub library on CPU tensors (their addresses stand for device pointers; nothing is computed).


@pytest.fixture
def stub_ops(use_library, stub_library, monkeypatch):
    """The ops running against the stub on CPU tensors: the device checks and CUDA device / stream calls stubbed out
    (the stub records stream 0). Returns a function use(path) that switches to another stub build."""
    import contextlib
    import types

    monkeypatch.setattr(_ops, "_check_device", lambda q, k, v: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0))
    use_library(stub_library)
    return use_library


def _seen_backward():
    seen = _lib.AttentionParamsStruct()
    _lib.load()._cdll.stub_last_backward_params(ctypes.byref(seen))
    return seen


def _seen_forward():
    seen = _lib.AttentionParamsStruct()
    _lib.load()._cdll.stub_last_params(ctypes.byref(seen))
    return seen


VARIANT_PARAM_CASES = [  # (flashcore.attention keyword arguments, (local, left, right), softcap)
    (dict(causal=True, window_size=(4095, 0)), (1, 4095, 0), 0.0),
    (dict(causal=True, attention_chunk=8192), (0, 0, 0), 0.0),  # Llama 4's chunked layers
    (dict(attention_chunk=3), (0, 0, 0), 0.0),
    (dict(causal=True, window_size=(127, 0), softcap=30.0, attention_chunk=100), (1, 127, 0), 30.0),
    (dict(window_size=(3, -1)), (1, 3, -1), 0.0),
    (dict(window_size=(-1, 5)), (1, -1, 5), 0.0),
    (dict(window_size=(0, 0)), (1, 0, 0), 0.0),
    (dict(causal=True, softcap=30.0, window_size=(127, 0)), (1, 127, 0), 30.0),
    (dict(softcap=50.0), (0, 0, 0), 50.0),
    (dict(causal=True, window_size=(-1, 7)), (0, 0, 0), 0.0),  # causal: plain causal attention, no window
]


@pytest.mark.parametrize("kwargs, window, softcap", VARIANT_PARAM_CASES,
                         ids=["causal4095", "chunk8192", "chunk3-full", "chunk-window-softcap", "left3", "right5",
                              "diag", "softcap-window", "softcap", "causal-right"])
@pytest.mark.parametrize("sinks_grad", [None, False, True], ids=["no-sinks", "sinks", "sinks-grad"])
def test_variant_backward_params(stub_ops, kwargs, window, softcap, sinks_grad):
    """window, softcap, sinks and attention_chunk of the forward reach flashcore_attention_backward as the forward got
    them; dsinks is a 4-byte aligned pointer when the sinks require grad, NULL otherwise; the sinks get a float32 (Hq,)
    gradient."""
    q, k, v = _qkv(2, 17, 33, 8, 2, 64)
    sinks = None
    if sinks_grad is not None:
        sinks = torch.linspace(-1.0, 1.0, 8).requires_grad_(sinks_grad)
    out = flashcore.attention(q, k, v, sinks=sinks, **kwargs)
    forward = _seen_forward()
    out.backward(torch.ones_like(out))
    seen = _seen_backward()
    assert (seen.local, seen.window_size_left, seen.window_size_right) == window
    assert (forward.local, forward.window_size_left, forward.window_size_right) == window
    assert seen.softcap == softcap == forward.softcap
    assert seen.attention_chunk == kwargs.get("attention_chunk", 0) == forward.attention_chunk
    assert seen.reserved4 == 0
    assert seen.causal == int(kwargs.get("causal", False))
    assert seen.sinks == (None if sinks is None else sinks.data_ptr()) == forward.sinks
    assert seen.lse == forward.lse and seen.lse is not None  # the forward's LSE, written with the same variants
    if sinks_grad:
        assert seen.dsinks is not None and seen.dsinks % 4 == 0
        assert seen.dsinks not in (seen.dq, seen.dk, seen.dv, seen.sinks)
        assert sinks.grad is not None and sinks.grad.shape == (8,) and sinks.grad.dtype == torch.float32
    else:
        assert seen.dsinks is None
        assert sinks is None or sinks.grad is None
    assert (seen.dout, seen.dq, seen.dk, seen.dv) != (None,) * 4
    assert seen.struct_size == ctypes.sizeof(_lib.AttentionParamsStruct) and seen.head_dim_v == 0


def test_sinks_alone_need_grad(stub_ops):
    """Sinks that require grad with q, k, v that do not: the backward runs (dsinks set), lse was asked for."""
    q, k, v = _qkv(2, 17, 17, 4, 2, 64, requires_grad=False)
    sinks = torch.zeros(4, requires_grad=True)
    out = flashcore.attention(q, k, v, causal=True, sinks=sinks)
    assert _seen_forward().lse is not None
    out.float().sum().backward()
    seen = _seen_backward()
    assert seen.sinks == sinks.data_ptr() and seen.dsinks is not None and sinks.grad.shape == (4,)


def test_variant_backward_params_of_sdpa_and_bf16_sinks(stub_ops):
    """sdpa's (B, H, S, D) tensors with a window, softcap and bf16 sinks (converted to a float32 copy for the library,
    whose gradient autograd converts back to bf16)."""
    q, k, v = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in _qkv(2, 33, 33, 8, 2, 64))
    sinks = torch.zeros(8, dtype=torch.bfloat16, requires_grad=True)
    out = flashcore.sdpa(q, k, v, is_causal=True, window_size=(15, 0), softcap=20.0, sinks=sinks)
    out.backward(torch.ones_like(out))
    seen = _seen_backward()
    assert (seen.local, seen.window_size_left, seen.softcap) == (1, 15, 20.0)
    assert seen.sinks is not None and seen.sinks != sinks.data_ptr()  # the float32 copy the forward read too
    assert seen.sinks == _seen_forward().sinks and seen.dsinks is not None
    assert sinks.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("chunk", [0, 4])
@pytest.mark.parametrize("sinks_grad", [False, True])
def test_varlen_variant_backward_params(stub_ops, sinks_grad, chunk):
    """Packed batches: the variants (attention_chunk among them), cu_seqlens and dsinks reach the backward."""
    q, k, v = (t[0] for t in _qkv(1, 12, 12, 4, 2, 64))  # (total, H, D)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    sinks = torch.zeros(4, requires_grad=sinks_grad)
    out = flashcore.varlen_attention(q, k, v, cu, cu, 7, 7, causal=True, window_size=(3, 0), softcap=10.0,
                                     sinks=sinks, attention_chunk=chunk)
    assert _seen_forward().attention_chunk == chunk
    out.backward(torch.ones_like(out))
    seen = _seen_backward()
    assert (seen.local, seen.window_size_left, seen.window_size_right, seen.softcap) == (1, 3, 0, 10.0)
    assert seen.attention_chunk == chunk
    assert seen.sinks == sinks.data_ptr() and seen.cu_seqlens_q == cu.data_ptr() == seen.cu_seqlens_k
    assert (seen.total_q, seen.seqlen_q, seen.batch) == (12, 7, 2)
    assert (seen.dsinks is not None) == sinks_grad
    assert (sinks.grad is not None) == sinks_grad


def test_variant_lse_grads_call(stub_ops, monkeypatch):
    """A gradient through lse with variants: one more backward call, on v = e_0 for every key, dO = g e_0 and O = 0
    (so that the kernel's dS is exactly g P), with the same variants and the forward's lse; no dsinks asked of it."""
    calls = []
    real = _ops._launch_backward

    def spy(lib, dout, q, k, v, out, lse, *rest, **kwargs):
        calls.append((dout.clone(), v.clone(), out.clone(), lse, kwargs))
        return real(lib, dout, q, k, v, out, lse, *rest, **kwargs)

    monkeypatch.setattr(_ops, "_launch_backward", spy)
    q, k, v = _qkv(1, 9, 9, 4, 2, 64)
    sinks = torch.zeros(4, requires_grad=True)
    out, lse = flashcore.attention(q, k, v, causal=True, softcap=5.0, window_size=(2, 0), sinks=sinks,
                                   attention_chunk=4, return_lse=True)
    # The stub wrote nothing: a finite lse of our own (through .data, which autograd's version check does not see).
    lse.data.copy_(torch.linspace(0.5, 1.5, lse.numel()).reshape(lse.shape))
    g = torch.randn(lse.shape)
    torch.autograd.backward([out, lse], [torch.ones_like(out), g])
    assert len(calls) == 2
    (_, _, _, _, first), (dout2, v2, out2, lse2, second) = calls
    assert first["dsinks"] is not None and second.get("dsinks") is None
    assert second["variants"].softcap == 5.0 and second["variants"].window_size_left == 2
    assert first["variants"].attention_chunk == second["variants"].attention_chunk == 4
    assert torch.all(out2 == 0)
    assert torch.all(v2[..., 0] == 1) and torch.all(v2[..., 1:] == 0)
    assert torch.all(dout2[..., 1:] == 0)
    torch.testing.assert_close(dout2[..., 0].float(), g.transpose(1, 2).to(torch.bfloat16).float())
    assert lse2.data_ptr() == lse.data_ptr()  # (the sinks' share of lse is added on the host: test_variants_cpu.py)


@pytest.fixture
def stub_v5_path(c_compiler, header_text, tmp_path):
    """The stub playing a 0.5 library: the variants in the forward, a plain backward, no dsinks."""
    return build_stub(c_compiler, tmp_path, "libflashcore_v5.so", "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V5_SIZE")


@pytest.mark.parametrize("kwargs, needle", [
    (dict(causal=True, window_size=(15, 0)), r"window_size=\(15, 0\)"),
    (dict(causal=True, attention_chunk=64), "attention_chunk=64"),
    (dict(softcap=30.0), "softcap=30.0"),
    (dict(sinks=True), r"sinks \(and their gradient, dsinks\)"),
])
def test_variant_backward_with_a_05_library(stub_ops, stub_v5_path, kwargs, needle):
    """A 0.5 library runs the variants' forward; .backward() raises RuntimeError naming the variants and the version
    needed (0.6), before any call of its backward (which would refuse them); the plain backward still runs."""
    stub_ops(stub_v5_path)
    assert _lib.load().params_struct_size == _lib.ATTENTION_PARAMS_V5_SIZE
    q, k, v = _qkv(2, 17, 17, 4, 2, 64)
    if kwargs.get("sinks"):
        kwargs = dict(kwargs, sinks=torch.zeros(4, requires_grad=True))
    out = flashcore.attention(q, k, v, **kwargs)
    with pytest.raises(RuntimeError, match=f"backward with {needle} needs a 0.6 library or newer"):
        out.backward(torch.ones_like(out))
    flashcore.attention(q, k, v, causal=True).backward(torch.ones_like(out))
    assert _seen_backward().struct_size == _lib.ATTENTION_PARAMS_V5_SIZE


@pytest.fixture
def stub_v4_path(c_compiler, header_text, tmp_path):
    return build_stub(c_compiler, tmp_path, "libflashcore_v4.so", "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V4_SIZE")


def test_variant_backward_with_a_04_library(stub_ops, stub_v4_path):
    """A 0.4 library refuses the variants in the forward already (RuntimeError naming them, 0.5 needed)."""
    stub_ops(stub_v4_path)
    q, k, v = _qkv(2, 17, 17, 4, 2, 64)
    with pytest.raises(RuntimeError, match="softcap is set, but .*a 0.5 library or newer is needed"):
        flashcore.attention(q, k, v, softcap=30.0)


def test_backward_params_with_variants(use_library, stub_library):
    """backward_params: the variants and dsinks in the C params (dsinks must be contiguous float32)."""
    use_library(stub_library)
    lib = _lib.load()
    q, k, v = _qkv(2, 17, 33, 8, 2, 64, requires_grad=False)
    out, lse, dout = torch.empty_like(q), torch.empty(2, 8, 17), torch.empty_like(q)
    dq, dk, dv = (_ops._grad_like(t) for t in (q, k, v))
    sinks, dsinks = torch.zeros(8), torch.empty(8)
    params = _ops.backward_params(lib, dout, q, k, v, out, lse, dq, dk, dv, False, 0.0, False,
                                  variants=_ops.Variants(5, 2, 12.0, sinks, 64), dsinks=dsinks)
    assert (params.local, params.window_size_left, params.window_size_right, params.softcap) == (1, 5, 2, 12.0)
    assert params.attention_chunk == 64
    assert (params.sinks, params.dsinks) == (sinks.data_ptr(), dsinks.data_ptr())
    with pytest.raises(ValueError, match="contiguous float32 dsinks"):
        _ops.backward_params(lib, dout, q, k, v, out, lse, dq, dk, dv, False, 0.0, False,
                             variants=_ops.Variants(5, 2, 12.0, sinks), dsinks=dsinks.double())
