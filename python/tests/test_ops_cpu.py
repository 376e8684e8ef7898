"""Torch-side logic that needs torch but no GPU: stride handling, argument errors, the custom op's
registration (schema, fake impl, autograd) and torch.compile wiring, with the kernel emulated on CPU."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _ops  # noqa: E402
from reference import emulate_on_cpu, reference  # noqa: E402


# ---------------------------------------------------------------------------------------------------------------
# Strides.


def test_contiguous_bshd_passes_through():
    t = torch.empty(2, 17, 4, 64, dtype=torch.float16)
    same, strides, copied = _ops.kernel_operand(t)
    assert same is t and not copied and strides == (17 * 4 * 64, 4 * 64, 64, 1)


def test_bhsd_view_passes_through():
    t = torch.empty(2, 4, 17, 64, dtype=torch.bfloat16).transpose(1, 2)  # BSHD view of BHSD storage
    same, strides, copied = _ops.kernel_operand(t)
    assert same is t and not copied and strides == (4 * 17 * 64, 64, 17 * 64, 1)


def test_sliced_heads_pass_through():
    t = torch.empty(2, 17, 8, 64, dtype=torch.float16)[:, :, 2:6]
    assert t.data_ptr() % 16 == 0
    same, strides, copied = _ops.kernel_operand(t)
    assert same is t and not copied and strides == (17 * 8 * 64, 8 * 64, 64, 1)


def test_size_one_dims_do_not_force_copies():
    t = torch.empty(1, 4, 1, 64, dtype=torch.float16).as_strided((1, 4, 1, 64), (3, 64, 5, 1))
    same, strides, copied = _ops.kernel_operand(t)
    assert same is t and not copied
    assert strides[1:] == (64, 256, 1) and strides[0] % 8 == 0 and strides[0] > 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(2 * 17 * 4 * 64 + 1).half()[1:].view(2, 17, 4, 64),  # misaligned pointer
        lambda: torch.randn(2, 17, 4, 68).half()[..., :64],  # head stride 68
        lambda: torch.randn(2, 17, 64, 4).half().transpose(2, 3),  # last dim not contiguous
        lambda: torch.randn(2, 1, 4, 64).half().expand(2, 17, 4, 64),  # zero stride
    ],
    ids=["misaligned", "stride-not-multiple-of-8", "last-dim-strided", "expanded"],
)
def test_unsupported_layouts_are_copied(make):
    t = make()
    assert _ops.abi_strides(t) is None
    copy, strides, copied = _ops.kernel_operand(t)
    assert copied and copy.is_contiguous() and copy.data_ptr() % 16 == 0
    assert torch.equal(copy, t) and strides == (17 * 4 * 64, 4 * 64, 64, 1)


# ---------------------------------------------------------------------------------------------------------------
# Argument errors detected before the device (CPU tensors suffice).


def _qkv(dtype=torch.float16, b=2, sq=16, sk=16, hq=4, hkv=2, d=64):
    return torch.randn(b, sq, hq, d, dtype=dtype), torch.randn(b, sk, hkv, d, dtype=dtype), torch.randn(
        b, sk, hkv, d, dtype=dtype
    )


def test_cpu_tensors_are_rejected():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        flashcore.attention(q, k, v)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        flashcore.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda q, k, v: (q.float(), k.float(), v.float()), TypeError, "float16 or bfloat16"),
        (lambda q, k, v: (q, k.bfloat16(), v), TypeError, "same dtype"),
        (lambda q, k, v: ("q", k, v), TypeError, "must be a torch.Tensor"),
        (lambda q, k, v: (q[0], k, v), ValueError, "must be 4-D"),
        (lambda q, k, v: (q, k, v[:, :8]), ValueError, "k and v must have the same shape"),
        (lambda q, k, v: (q[:1], k, v), ValueError, "same batch size"),
        (lambda q, k, v: (q[..., :32], k, v), ValueError, "same head_dim"),
        (lambda q, k, v: (q[:, :, :3], k, v), ValueError, "multiple of the number of key/value heads"),
    ],
    ids=["fp32", "mixed-dtype", "not-a-tensor", "rank", "kv-shape", "batch", "head-dim", "head-ratio"],
)
def test_argument_errors(mutate, exc, match):
    q, k, v = mutate(*_qkv())
    with pytest.raises(exc, match=match):
        flashcore.attention(q, k, v)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_softmax_scale(scale):
    with pytest.raises(ValueError, match="softmax_scale"):
        flashcore.attention(*_qkv(), softmax_scale=scale)


def test_sdpa_rejects_mask_and_dropout():
    q, k, v = (t.transpose(1, 2) for t in _qkv())
    with pytest.raises(ValueError, match="attn_mask is not supported"):
        flashcore.sdpa(q, k, v, attn_mask=torch.ones(16, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match="dropout is not supported"):
        flashcore.sdpa(q, k, v, dropout_p=0.1)


# ---------------------------------------------------------------------------------------------------------------
# Custom op wiring with the kernel emulated on CPU.


@pytest.fixture
def emulated(monkeypatch):
    emulate_on_cpu(monkeypatch)


def test_custom_op_registration(emulated):
    q, k, v = _qkv(torch.bfloat16, sq=17, sk=33)
    torch.library.opcheck(
        torch.ops.flashcore.attention_fwd.default,
        (q, k, v, True, 0.0, True),
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"),
    )


def test_emulated_outputs_and_layouts(emulated):
    q, k, v = _qkv(torch.bfloat16, sq=17, sk=33, hq=8, hkv=2)
    out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (2, 8, 17) and lse.dtype == torch.float32
    ref_out, ref_lse = reference(q, k, v, causal=True)
    torch.testing.assert_close(out.float(), ref_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, ref_lse)
    out_sdpa = flashcore.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    assert out_sdpa.shape == (2, 8, 17, 64)
    torch.testing.assert_close(out_sdpa.transpose(1, 2), out)


def test_empty_inputs(emulated):
    q, k, v = _qkv(sq=0)
    assert flashcore.attention(q, k, v).shape == (2, 0, 4, 64)
    q, k, v = _qkv(sk=0)
    out, lse = flashcore.attention(q, k, v, return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compile_fullgraph_wiring(emulated, backend):
    torch._dynamo.reset()
    q, k, v = _qkv(torch.bfloat16, sq=17, sk=17)

    def fn(q, k, v):
        out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
        return out * 2, lse

    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    for got, want in zip(compiled(q, k, v), fn(q, k, v)):
        torch.testing.assert_close(got, want)


def test_inference_mode(emulated):
    with torch.inference_mode():
        assert flashcore.attention(*_qkv()).shape == (2, 16, 4, 64)


@pytest.mark.parametrize("scale", [1e-50, 2.0**-101, 2.0**101, 1e300])
def test_softmax_scale_outside_the_abi_range(scale):
    """A scale that a C float cannot carry (1e-50 would become 0.0, "the default") or outside [2**-100, 2**100]."""
    with pytest.raises(ValueError, match=r"softmax_scale must be a finite number in \[2\*\*-100, 2\*\*100\]"):
        flashcore.attention(*_qkv(), softmax_scale=scale)


@pytest.mark.parametrize("scale", [2.0**-100, 2.0**100])
def test_softmax_scale_range_ends_are_accepted(emulated, scale):
    q, k, v = _qkv(torch.bfloat16)
    assert flashcore.attention(q, k, v, softmax_scale=scale).shape == q.shape


# ---------------------------------------------------------------------------------------------------------------
# Plans (flashcore.plan_attention; the C ABI's flashcore_attention_plan / _run).


def test_plan_api_is_exported_and_bound():
    assert flashcore.plan_attention is _ops.plan_attention and flashcore.AttentionPlan is _ops.AttentionPlan
    from flashcore import _lib

    try:
        lib = _lib.load()
    except RuntimeError as exc:
        pytest.skip(f"libflashcore.so not loadable: {exc}")
    if lib.version < (0, 3, 0) or lib.path.endswith("stub.so"):
        pytest.skip(f"{lib.path} ({lib.version_string()}) predates plans")
    assert {"flashcore_attention_plan", "flashcore_attention_run", "flashcore_plan_destroy"} <= lib._optional


def test_plan_refuses_cpu_tensors():
    q = torch.empty(1, 8, 2, 64, dtype=torch.bfloat16)
    with pytest.raises((ValueError, RuntimeError)):
        flashcore.plan_attention(q, q, q)
