"""The 8-bit path of flashcore.attention without a GPU: the ABI constants, quantize_fp8's arithmetic, argument
errors, the C params of 8-bit calls (through the host-only stub library), fake-tensor shapes, and the custom op /
torch.compile wiring with the kernel emulated on CPU by the float64 reference of the dequantized inputs."""

import ctypes
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from reference import dequantize, emulate_on_cpu, reference_fp64, rel_rmse  # noqa: E402

E4M3 = torch.float8_e4m3fn


def _qkv(dtype=torch.bfloat16, b=2, sq=17, sk=33, hq=8, hkv=2, d=128, seed=0, spread=False):
    """Random (B, S, H, D) q, k, v; with spread, every (batch, head) gets its own magnitude (1/8 .. 8)."""
    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for s, h in ((sq, hq), (sk, hkv), (sk, hkv)):
        t = torch.randn(b, s, h, d, generator=gen)
        if spread:
            t = t * torch.exp2(torch.randint(-3, 4, (b, 1, h, 1), generator=gen).float())
        tensors.append(t.to(dtype))
    return tuple(tensors)


def _quantized(q, k, v):
    """((q8, k8, v8), (qd, kd, vd)) per (batch, KV head)."""
    heads_kv = k.shape[2]
    (q8, qd), (k8, kd), (v8, vd) = (flashcore.quantize_fp8(t, num_heads_kv=heads_kv) for t in (q, k, v))
    return (q8, k8, v8), (qd, kd, vd)


# ---------------------------------------------------------------------------------------------------------------
# ABI constants and exports.


def test_constants_and_exports():
    assert (_lib.PRECISION_NATIVE, _lib.PRECISION_FP8, _lib.PRECISION_INT8, _lib.DTYPE_INT8) == (0, 1, 2, 5)
    assert _lib.DTYPE_FP8_E4M3 == 3 and _lib.DTYPE_NAMES[_lib.DTYPE_FP8_E4M3] == str(E4M3).replace("torch.", "")
    assert _ops._INPUT_DTYPE_CODES[E4M3] == _lib.DTYPE_FP8_E4M3
    assert _ops.PRECISIONS == {None: 0, "native": 0, "fp8": 1, "int8": 2}
    assert _ops.FP8_MAX == torch.finfo(E4M3).max == 448.0
    assert flashcore.quantize_fp8 is _ops.quantize_fp8
    assert "quantize_fp8" in dir(flashcore)
    schema = str(torch.ops.flashcore.attention_fwd.default._schema)
    assert ("Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None, ScalarType? out_dtype=None, "
            "SymInt precision=0") in schema
    assert "bool v_transposed=False" in schema
    assert flashcore.fp8_transpose_v is _ops.fp8_transpose_v and "fp8_transpose_v" in dir(flashcore)
    assert "Tensor v) -> Tensor" in str(torch.ops.flashcore.fp8_transpose_v.default._schema)


# ---------------------------------------------------------------------------------------------------------------
# quantize_fp8.


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_fp8_scales_and_round_trip(dtype):
    x = _qkv(dtype, hq=6, spread=True)[0]  # (2, 17, 6, 128)
    x8, descale = flashcore.quantize_fp8(x)
    assert x8.dtype == E4M3 and x8.shape == x.shape and x8.is_contiguous()
    assert descale.dtype == torch.float32 and descale.shape == (2, 6) and descale.is_contiguous()
    amax = x.float().abs().amax(dim=(1, 3))
    torch.testing.assert_close(descale, amax / 448.0, rtol=1e-6, atol=0)
    # Each group's absolute maximum maps to 448 (the e4m3 maximum): the full range is used.
    assert torch.equal(x8.float().abs().amax(dim=(1, 3)), torch.full((2, 6), 448.0))
    # Round trip: e4m3 keeps 3 mantissa bits (relative error <= 2**-4), subnormals below 2**-6 (spacing 2**-9).
    back = dequantize(x8, descale)
    bound = 2.0**-4 * x.double().abs() + 2.0**-10 * descale.double()[:, None, :, None] + 1e-12
    assert torch.all((back - x.double()).abs() <= bound)


def test_quantize_fp8_groups_query_heads_by_kv_head():
    q = _qkv(torch.float32, hq=8, spread=True)[0]
    q8, descale = flashcore.quantize_fp8(q, num_heads_kv=2)  # heads 0-3 share KV head 0's factor, 4-7 KV head 1's
    assert descale.shape == (2, 2)
    amax = q.abs().amax(dim=(1, 3)).reshape(2, 2, 4).amax(dim=2)
    torch.testing.assert_close(descale, amax / 448.0, rtol=1e-6, atol=0)
    torch.testing.assert_close(dequantize(q8, descale), q.double(), rtol=2.0**-4, atol=2.0**-10 * descale.max().item())
    # MQA: one factor per batch entry.
    assert flashcore.quantize_fp8(q, num_heads_kv=1)[1].shape == (2, 1)


def test_quantize_fp8_bhsd_layout_matches_bshd():
    x = _qkv(torch.float32, spread=True)[0]
    x8, descale = flashcore.quantize_fp8(x, num_heads_kv=4)
    y8, ydescale = flashcore.quantize_fp8(x.transpose(1, 2), layout="bhsd", num_heads_kv=4)
    assert y8.shape == (2, 8, 17, 128) and y8.is_contiguous()
    assert torch.equal(ydescale, descale)
    assert torch.equal(y8.transpose(1, 2).float(), x8.float())


def test_quantize_fp8_zero_groups_and_outliers():
    x = torch.zeros(2, 16, 2, 128)
    x[1, :, 1] = torch.randn(16, 128)
    x[1, 3, 1, 5] = 1000.0  # an outlier sets its group's scale, the rest of the group keeps its relative order
    x8, descale = flashcore.quantize_fp8(x)
    assert descale[0].tolist() == [1.0, 1.0] and descale[1, 0].item() == 1.0  # all-zero groups: descale 1
    assert torch.all(x8[0].float() == 0) and torch.all(x8[1, :, 0].float() == 0)
    torch.testing.assert_close(descale[1, 1], torch.tensor(1000.0 / 448.0))
    assert x8[1, 3, 1, 5].float().item() == 448.0
    assert torch.isfinite(x8.float()).all()


def _as_numpy(x):
    pytest.importorskip("numpy", reason="numpy is not installed (torch.Tensor.numpy() needs it)")
    return x.numpy()


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda x: flashcore.quantize_fp8(x, layout="sbhd"), ValueError, "layout must be 'bshd' or 'bhsd'"),
        (lambda x: flashcore.quantize_fp8(x[0]), ValueError, "must be 4-D"),
        (lambda x: flashcore.quantize_fp8(x, num_heads_kv=3), ValueError, "multiple of num_heads_kv"),
        (lambda x: flashcore.quantize_fp8(x, num_heads_kv=0), ValueError, "multiple of num_heads_kv"),
        (lambda x: flashcore.quantize_fp8(x, num_heads_kv=2.0), TypeError, "num_heads_kv must be an int"),
        (lambda x: flashcore.quantize_fp8(x.to(E4M3)), TypeError, "x must be float16, bfloat16"),
        (lambda x: flashcore.quantize_fp8(x.to(torch.int32)), TypeError, "x must be float16, bfloat16"),
        (lambda x: flashcore.quantize_fp8(_as_numpy(x)), TypeError, "x must be a torch.Tensor"),
    ],
    ids=["layout", "rank", "heads-3", "heads-0", "heads-float", "fp8-input", "int-input", "numpy"],
)
def test_quantize_fp8_errors(call, exc, match):
    x = torch.randn(2, 5, 4, 128)
    with pytest.raises(exc, match=match):
        call(x)


# ---------------------------------------------------------------------------------------------------------------
# Argument errors (the device check is emulated away: CPU tensors reach the 8-bit checks).


@pytest.fixture
def emulated(monkeypatch):
    """The CPU emulation, recording each launch's keyword arguments in the returned list."""
    emulate_on_cpu(monkeypatch)
    calls = []
    launch = _ops._launch

    def recording_launch(*args, **kwargs):
        calls.append(kwargs)
        return launch(*args, **kwargs)

    monkeypatch.setattr(_ops, "_launch", recording_launch)
    return calls


def _fp8_args(**overrides):
    (q8, k8, v8), (qd, kd, vd) = _quantized(*_qkv(spread=True))
    args = {"q": q8, "k": k8, "v": v8, "q_descale": qd, "k_descale": kd, "v_descale": vd}
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda a: {**a, "q_descale": a["q_descale"].half()}, TypeError, "q_descale must be float32"),
        (lambda a: {**a, "k_descale": a["k_descale"].double()}, TypeError, "k_descale must be float32"),
        (lambda a: {**a, "v_descale": 1.0}, TypeError, "v_descale must be a torch.Tensor or None"),
        (lambda a: {**a, "q_descale": torch.ones(2, 8)}, ValueError,
         r"q_descale must have shape \(batch, num_heads_kv\) = \(2, 2\), got \(2, 8\)"),
        (lambda a: {**a, "k_descale": torch.ones(2)}, ValueError, r"k_descale must have shape .* got \(2,\)"),
        (lambda a: {**a, "v_descale": torch.ones(1, 2)}, ValueError, r"v_descale must have shape .* got \(1, 2\)"),
        (lambda a: {**a, "v_descale": torch.ones(2, 2, device="meta")}, ValueError, "v_descale is on meta"),
        (lambda a: {**a, "precision": "fp8"}, ValueError, "already float8_e4m3fn"),
        (lambda a: {**a, "precision": "int8"}, ValueError, "already float8_e4m3fn"),
        (lambda a: {**a, "precision": "int4"}, ValueError, "precision must be None, 'native', 'fp8' or 'int8'"),
        (lambda a: {**a, "precision": 1}, TypeError, "precision must be None, 'native', 'fp8' or 'int8'"),
        (lambda a: {**a, "out_dtype": torch.float32}, TypeError, "out_dtype must be torch.float16, torch.bfloat16"),
        (lambda a: {**a, "out_dtype": "bf16"}, TypeError, "out_dtype must be"),
        (lambda a: {**a, "k": a["k"].bfloat16()}, TypeError, "same dtype"),
        (lambda a: {**a, "q": a["q"].float().to(torch.float8_e5m2)}, TypeError, "same dtype"),
        (lambda a: {**a, "q": a["q"][..., :64], "k": a["k"][..., :64], "v": a["v"][..., :64]}, ValueError,
         "head_dim 64 has no 8-bit kernel"),
    ],
    ids=["q-descale-fp16", "k-descale-fp64", "v-descale-float", "q-descale-query-heads", "k-descale-1d",
         "v-descale-batch", "v-descale-device", "precision-fp8", "precision-int8", "precision-int4", "precision-int", "out-fp32",
         "out-str", "mixed-dtypes", "e5m2-with-e4m3", "head-dim-64"],
)
def test_fp8_argument_errors(emulated, make, exc, match):
    with pytest.raises(exc, match=match):
        flashcore.attention(**make(_fp8_args()))
    assert not emulated  # nothing was launched


def test_v_transposed_argument_errors(emulated):
    args = _fp8_args()
    vt_shape = _ops.transposed_v_shape(args["v"])
    assert vt_shape == (2, 2, args["v"].shape[3], (args["v"].shape[1] + 127) // 128 * 128)
    with pytest.raises(ValueError, match="v must be flashcore.fp8_transpose_v"):
        flashcore.attention(**args, v_transposed=True)  # the float8 V itself
    with pytest.raises(ValueError, match=r"contiguous uint8 tensor of shape"):
        flashcore.attention(**{**args, "v": torch.zeros(vt_shape[:3] + (vt_shape[3] + 128,), dtype=torch.uint8)},
                            v_transposed=True)
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="v_transposed=True is for 8-bit"):
        flashcore.attention(q, k, torch.zeros(_ops.transposed_v_shape(v), dtype=torch.uint8), v_transposed=True)
    with pytest.raises(TypeError, match="fp8_transpose_v takes an 8-bit"):
        flashcore.fp8_transpose_v(v)
    assert not emulated


@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale"])
def test_descales_are_for_8bit_inputs_only(emulated, name):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=f"{name} is for 8-bit \\(float8\\) inputs only"):
        flashcore.attention(q, k, v, **{name: torch.ones(2, 2)})
    with pytest.raises(ValueError, match=f"{name} is for 8-bit \\(float8\\) inputs only"):
        flashcore.attention(q, k, v, precision="fp8", **{name: torch.ones(2, 2)})
    assert not emulated


def test_precision_fp8_needs_an_8bit_head_dim(emulated):
    q, k, v = _qkv(d=64)
    with pytest.raises(ValueError, match="head_dim 64 has no 8-bit kernel"):
        flashcore.attention(q, k, v, precision="fp8")
    assert flashcore.attention(q, k, v, precision="native").dtype == torch.bfloat16  # the 16-bit kernel


def test_8bit_inputs_elsewhere_are_refused(emulated):
    """Only flashcore.attention's dense calls take float8 q, k and v: sdpa and varlen say so clearly. (An e4m3 q on an
    e4m3 KV cache is attention_with_kvcache's FP8 call: test_kv_fp8_cpu.py.)"""
    (q8, k8, v8), _ = _quantized(*_qkv(sq=16, sk=16))
    match = "float8_e4m3fn / float8_e5m2 inputs are supported by flashcore.attention on dense batches only"
    with pytest.raises(TypeError, match=match):
        flashcore.sdpa(q8.transpose(1, 2), k8.transpose(1, 2), v8.transpose(1, 2))
    with pytest.raises(TypeError, match="is read under float16, bfloat16 or float8_e4m3fn q, got q of dtype "
                                        "torch.float8_e5m2"):
        flashcore.attention_with_kvcache(q8.float().to(torch.float8_e5m2), k8, v8,
                                         cache_seqlens=torch.tensor([3, 16], dtype=torch.int32))
    cu = torch.tensor([0, 16, 32], dtype=torch.int32)
    with pytest.raises(TypeError, match=match):
        flashcore.varlen_attention(q8.flatten(0, 1), k8.flatten(0, 1), v8.flatten(0, 1), cu, cu, 16, 16)
    assert not emulated


def test_cpu_tensors_are_rejected():
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        flashcore.attention(**_fp8_args())


# ---------------------------------------------------------------------------------------------------------------
# Emulated 8-bit calls: output dtypes and shapes, the descales reaching the launch in order.


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("eight_bit", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
def test_fp8_inputs_emulated(emulated, eight_bit, out_dtype, causal):
    """float8_e4m3fn and float8_e5m2 inputs take the same path (descales in order, O in out_dtype or bf16)."""
    args = _fp8_args()
    for n in "qkv":
        args[n] = args[n].float().to(eight_bit)  # (e4m3: unchanged)
    out, lse = flashcore.attention(**args, causal=causal, return_lse=True, out_dtype=out_dtype)
    assert out.dtype == (out_dtype or torch.bfloat16) and out.shape == (2, 17, 8, 128) and out.is_contiguous()
    assert lse.shape == (2, 8, 17) and lse.dtype == torch.float32
    # An independent reference: each tensor dequantized with its own factor (a swapped descale would show).
    deq = [dequantize(args[n], args[f"{n}_descale"]) for n in "qkv"]
    ref, ref_lse = reference_fp64(*deq, causal=causal)
    assert rel_rmse(out, ref) < 1e-2
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-4)
    (launch,) = emulated
    assert [d is args[f"{n}_descale"] for n, d in zip("qkv", launch["descales"])] == [True] * 3
    assert launch["precision"] == _lib.PRECISION_NATIVE


def test_fp8_descales_default_to_one(emulated):
    args = _fp8_args(q_descale=None, v_descale=None)
    out = flashcore.attention(**args)
    ref, _ = reference_fp64(args["q"].double(), dequantize(args["k"], args["k_descale"]), args["v"].double())
    assert rel_rmse(out, ref) < 1e-2
    assert emulated[0]["descales"][0] is None and emulated[0]["descales"][2] is None


def test_noncontiguous_descales_are_made_contiguous(emulated):
    args = _fp8_args()
    wide = torch.ones(2, 4)
    wide[:, ::2] = args["k_descale"]
    args["k_descale"] = wide[:, ::2]
    assert not args["k_descale"].is_contiguous()
    flashcore.attention(**args)
    assert emulated[0]["descales"][1].is_contiguous()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, torch.float16])
def test_precision_fp8_emulated(emulated, dtype, out_dtype):
    q, k, v = _qkv(dtype)  # N(0, 1): the GPU tests' rule for precision="fp8" (wider spreads sharpen the softmax)
    out = flashcore.attention(q, k, v, causal=True, precision="fp8", out_dtype=out_dtype)
    assert out.dtype == (out_dtype or dtype) and out.shape == q.shape
    assert emulated[0]["precision"] == _lib.PRECISION_FP8 and emulated[0]["descales"] == (None, None, None)
    ref, _ = reference_fp64(q, k, v, causal=True)
    assert rel_rmse(out, ref) < 0.07


def test_native_calls_are_unchanged(emulated):
    """A 16-bit call without 8-bit arguments is the 0.2 call: no 8-bit keyword reaches the launch."""
    q, k, v = _qkv()
    flashcore.attention(q, k, v)
    flashcore.attention(q, k, v, precision="native", out_dtype=torch.bfloat16)
    assert emulated == [{}, {}]
    out = flashcore.attention(q, k, v, out_dtype=torch.float16)  # another output dtype: through out's dtype
    assert out.dtype == torch.float16 and emulated[2]["precision"] == _lib.PRECISION_NATIVE


def test_empty_8bit_inputs(emulated):
    args = _fp8_args()
    out = flashcore.attention(**{**args, "q": args["q"][:, :0]})
    assert out.shape == (2, 0, 8, 128) and out.dtype == torch.bfloat16
    out, lse = flashcore.attention(**{**args, "k": args["k"][:, :0], "v": args["v"][:, :0]}, return_lse=True,
                                   out_dtype=torch.float16)
    assert out.dtype == torch.float16 and torch.all(out == 0) and torch.all(lse == -math.inf)
    assert not emulated


# ---------------------------------------------------------------------------------------------------------------
# The custom op: registration, fake tensors, torch.compile.


def test_custom_op_registration_8bit(emulated):
    (q8, k8, v8), (qd, kd, vd) = _quantized(*_qkv())
    # test_schema compares inputs with torch.allclose, which has no float8 kernel on CPU: the fp8-input call is
    # checked by the fake-tensor and AOT tests, the schema by the precision="fp8" call.
    torch.library.opcheck(torch.ops.flashcore.attention_fwd.default,
                          (q8, k8, v8, True, 0.0, True, qd, kd, vd, torch.float16, _lib.PRECISION_NATIVE),
                          test_utils=("test_faketensor", "test_aot_dispatch_static"))
    q, k, v = _qkv()
    torch.library.opcheck(torch.ops.flashcore.attention_fwd.default,
                          (q, k, v, False, 0.0, True, None, None, None, torch.float16, _lib.PRECISION_FP8),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_fake_tensor_shapes():
    """The fake implementation on fake CUDA tensors (no GPU, no library): shapes, dtypes, devices, and its checks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = torch.ops.flashcore.attention_fwd
    with FakeTensorMode():
        q = torch.empty(3, 40, 8, 256, dtype=E4M3, device="cuda")
        k = torch.empty(3, 70, 2, 256, dtype=E4M3, device="cuda")
        descale = torch.empty(3, 2, device="cuda")
        out, lse = op(q, k, k, True, 0.0, True, descale, descale, None, None, _lib.PRECISION_NATIVE)
        assert (out.shape, out.dtype, out.device.type) == ((3, 40, 8, 256), torch.bfloat16, "cuda")
        assert (lse.shape, lse.dtype) == ((3, 8, 40), torch.float32)
        out, lse = op(q, k, k, False, 0.0, False, None, None, None, torch.float16, _lib.PRECISION_NATIVE)
        assert out.dtype == torch.float16 and lse.shape == (0,)
        qb, kb = q.to(torch.bfloat16), k.to(torch.bfloat16)
        out, _ = op(qb, kb, kb, False, 0.0, False, None, None, None, None, _lib.PRECISION_FP8)
        assert out.dtype == torch.bfloat16 and out.shape == qb.shape
        with pytest.raises(ValueError, match=r"q_descale must have shape \(batch, num_heads_kv\) = \(3, 2\)"):
            op(q, k, k, False, 0.0, False, torch.empty(3, 8, device="cuda"), None, None, None, 0)
        with pytest.raises(ValueError, match="already float8_e4m3fn"):
            op(q, k, k, False, 0.0, False, None, None, None, None, _lib.PRECISION_FP8)
        with pytest.raises(ValueError, match="precision must be PRECISION_NATIVE"):
            op(qb, kb, kb, False, 0.0, False, None, None, None, None, 7)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compile_fullgraph_8bit(emulated, backend):
    torch._dynamo.reset()
    args = _fp8_args()
    q, k, v = _qkv(seed=3)

    def fn(args, q, k, v):
        out, lse = flashcore.attention(**args, causal=True, return_lse=True, out_dtype=torch.float16)
        auto = flashcore.attention(q, k, v, precision="fp8")
        return out.float() * 2, lse, auto

    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    for got, want in zip(compiled(args, q, k, v), fn(args, q, k, v)):
        torch.testing.assert_close(got, want)


def test_compile_quantize_then_attend(emulated):
    """quantize_fp8 is plain torch: it compiles into the same graph as the op."""
    torch._dynamo.reset()
    q, k, v = _qkv(seed=4)

    def fn(q, k, v):
        (q8, k8, v8), (qd, kd, vd) = _quantized(q, k, v)
        return flashcore.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)

    torch.testing.assert_close(torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v), fn(q, k, v))


# ---------------------------------------------------------------------------------------------------------------
# The C params of 8-bit calls and the capability checks, through the host-only stub library.


def test_fp8_strides_need_16_bytes():
    """Strides must be multiples of 16 bytes: 8 elements of bf16 but 16 of e4m3."""
    bf16 = torch.empty(2, 17, 4, 136, dtype=torch.bfloat16)[..., :128]  # head stride 136
    assert _ops.abi_strides(bf16) == (17 * 4 * 136, 4 * 136, 136, 1)
    fp8 = torch.empty(2, 17, 4, 136, dtype=E4M3)[..., :128]
    assert _ops.abi_strides(fp8) is None
    copy, strides, copied = _ops.kernel_operand(fp8)
    assert copied and copy.dtype == E4M3 and strides == (17 * 4 * 128, 4 * 128, 128, 1)
    padded = torch.empty(2, 17, 4, 144, dtype=E4M3)[..., :128]
    assert _ops.abi_strides(padded) == (17 * 4 * 144, 4 * 144, 144, 1)
    view = torch.empty(2, 4, 17, 128, dtype=E4M3).transpose(1, 2)  # (B, H, S, D) storage
    assert _ops.kernel_operand(view)[0] is view
    one = torch.empty(1, 1, 1, 128, dtype=E4M3)
    assert all(st % 16 == 0 for st in _ops.abi_strides(one)[:3])


def _seen(lib):
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    return seen


def test_fp8_params(use_library, stub_library):
    use_library(stub_library)
    lib = _lib.load()
    (q8, k8, v8), (qd, kd, vd) = _quantized(*_qkv())
    out = torch.empty(q8.shape, dtype=torch.bfloat16)
    lse = torch.empty(2, 8, 17)
    params = _ops.kernel_params(lib, q8, k8, v8, out, lse, True, 0.0, descales=(qd, kd, vd))
    lib.forward(params, 0)
    seen = _seen(lib)
    assert seen.struct_size == ctypes.sizeof(_lib.AttentionParamsStruct)
    assert (seen.dtype, seen.out_dtype, seen.precision, seen.reserved2) == (
        _lib.DTYPE_FP8_E4M3, _lib.DTYPE_BF16, _lib.PRECISION_NATIVE, 0)
    assert (seen.q_descale, seen.k_descale, seen.v_descale) == (qd.data_ptr(), kd.data_ptr(), vd.data_ptr())
    assert (seen.batch, seen.seqlen_q, seen.seqlen_k, seen.num_heads_q, seen.num_heads_kv, seen.head_dim) == (
        2, 17, 33, 8, 2, 128)
    assert (seen.q_strides.seq, seen.k_strides.head, seen.lse_capacity) == (8 * 128, 128, 2 * 8 * 17)
    # Partial descales, an fp16 output.
    params = _ops.kernel_params(lib, q8, k8, v8, out.half(), None, False, 0.0, descales=(None, kd, None))
    lib.forward(params, 0)
    seen = _seen(lib)
    assert (seen.out_dtype, seen.q_descale, seen.k_descale, seen.v_descale) == (
        _lib.DTYPE_FP16, None, kd.data_ptr(), None)
    params = _ops.kernel_params(lib, q8.float().to(torch.float8_e5m2), k8.float().to(torch.float8_e5m2),
                                v8.float().to(torch.float8_e5m2), out, None, False, 0.0, descales=(qd, kd, vd))
    lib.forward(params, 0)
    assert (_seen(lib).dtype, _seen(lib).out_dtype) == (_lib.DTYPE_FP8_E5M2, _lib.DTYPE_BF16)
    with pytest.raises(ValueError, match="contiguous float32 q_descale"):
        _ops.kernel_params(lib, q8, k8, v8, out, None, False, 0.0, descales=(torch.ones(2, 4)[:, ::2], None, None))


def test_precision_fp8_params(use_library, stub_library):
    use_library(stub_library)
    lib = _lib.load()
    q, k, v = _qkv(torch.float16)
    params = _ops.kernel_params(lib, q, k, v, torch.empty_like(q), None, False, 0.0, precision=_lib.PRECISION_FP8)
    lib.forward(params, 0)
    seen = _seen(lib)
    assert (seen.dtype, seen.out_dtype, seen.precision) == (_lib.DTYPE_FP16, _lib.DTYPE_SAME, _lib.PRECISION_FP8)
    assert (seen.q_descale, seen.k_descale, seen.v_descale) == (None, None, None)
    params = _ops.kernel_params(lib, q, k, v, torch.empty_like(q, dtype=torch.bfloat16), None, False, 0.0)
    lib.forward(params, 0)
    assert (_seen(lib).out_dtype, _seen(lib).precision) == (_lib.DTYPE_BF16, _lib.PRECISION_NATIVE)


def test_capability_checks(use_library, stub_library):
    """_check_extended_supported against the stub (8-bit kernels for head dims 128 and 256)."""
    use_library(stub_library)
    lib = _lib.load()
    q8 = torch.empty(1, 4, 2, 128, dtype=E4M3)
    _ops._check_extended_supported(lib, q8, False, torch.bfloat16, _lib.PRECISION_NATIVE)
    _ops._check_extended_supported(lib, q8.bfloat16(), True, torch.float16, _lib.PRECISION_FP8)
    with pytest.raises(ValueError, match=r"head_dim 64 has no 8-bit kernel \(causal\) on this device \(8-bit head "
                                         r"dims here: \[128, 256\]"):
        _ops._check_extended_supported(lib, q8[..., :64], True, torch.bfloat16, _lib.PRECISION_NATIVE)
    with pytest.raises(ValueError, match="head_dim 64 has no 8-bit kernel"):
        _ops._check_extended_supported(lib, q8[..., :64].half(), False, torch.float16, _lib.PRECISION_FP8)
    _ops._check_extended_supported(lib, q8[..., :64].half(), False, torch.bfloat16, _lib.PRECISION_NATIVE)


def test_capability_checks_with_a_0_2_library(use_library, c_compiler, header_text, tmp_path):
    """A 0.2 library (struct_size 448) gets no 8-bit call: the fields past its struct would be ignored."""
    from conftest import build_stub

    use_library(build_stub(c_compiler, tmp_path, "libflashcore_v2.so",
                           "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V2_SIZE"))
    lib = _lib.load()
    q = torch.empty(1, 4, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="predates the 8-bit path"):
        _ops._check_extended_supported(lib, q, False, torch.bfloat16, _lib.PRECISION_FP8)
    with pytest.raises(RuntimeError, match="predates the 8-bit path"):
        _ops._check_extended_supported(lib, q.to(E4M3), False, torch.bfloat16, _lib.PRECISION_NATIVE)
    _ops._check_extended_supported(lib, q, False, torch.float16, _lib.PRECISION_NATIVE)  # out_dtype is 0.2
    # A plain 16-bit call is unchanged: struct_size 448, nothing written past it.
    params = _ops.kernel_params(lib, q, q, q, torch.empty_like(q), None, False, 0.0)
    assert params.struct_size == _lib.ATTENTION_PARAMS_V2_SIZE
    tail = ctypes.string_at(ctypes.addressof(params) + _lib.ATTENTION_PARAMS_V2_SIZE,
                            ctypes.sizeof(params) - _lib.ATTENTION_PARAMS_V2_SIZE)
    assert tail == bytes(len(tail))
    lib.forward(params, 0)
