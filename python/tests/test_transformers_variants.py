"""The transformers adapter with the attention variants (issue #72): tiny randomly initialised Mistral (sliding window),
Gemma 2 (sliding window and softcap) and gpt-oss (sliding window and attention sinks, s_aux) models, no downloads, with
attn_implementation "fcore" / "flashcore" against the models' own eager attention.

On the CPU the kernel is emulated by the float64 reference (reference.emulate_on_cpu): that checks the adapter's
conventions (a window of N tokens is FlashAttention's left bound N - 1, softcap and sinks reach the kernel, the mask
builder leaves sliding-window masks to the attention function, fallbacks honour softcap and sinks) against the models'
eager code. On the GPU the same comparisons run the real kernels (a 0.5 library; skipped otherwise)."""

import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import flashcore  # noqa: E402
import flashcore.integrations.transformers as fc_hf  # noqa: E402
from reference import emulate_on_cpu  # noqa: E402

WINDOW = 16  # the models' sliding window: the tests run 64 tokens, so it hides keys
COMMON = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
              vocab_size=1000, max_position_embeddings=512, sliding_window=WINDOW)


def _config(arch):
    """The tiny config of `arch`, or None when the installed transformers lacks the model."""
    if arch == "mistral" and hasattr(transformers, "MistralConfig"):
        return transformers.MistralConfig(intermediate_size=512, **COMMON)
    if arch == "gemma2" and hasattr(transformers, "Gemma2Config"):
        # Layers alternate sliding / full. The softcap is small enough to matter for these random weights (their scaled
        # scores are of the order of 0.1; Gemma 2's real 50.0 would leave them unchanged).
        return transformers.Gemma2Config(intermediate_size=512, query_pre_attn_scalar=64, attn_logit_softcapping=0.05,
                                         final_logit_softcapping=None, **COMMON)
    if arch == "gpt_oss" and hasattr(transformers, "GptOssConfig"):
        # Every token takes all 4 experts, so that the MLP is continuous in its inputs: a top-2 choice can flip on a
        # near-tie between two bf16 computations of the same scores (incremental decoding against the teacher-forced
        # pass). With top-2 the GPU's decoding logits differed from eager's by 0.43 in one H100 run, with every
        # attention check of the variants passing.
        return transformers.GptOssConfig(intermediate_size=256, num_local_experts=4, num_experts_per_tok=4,
                                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **COMMON)
    return None


# Names each model can use: gpt-oss lists its own FlashAttention kernels (_compatible_flash_implementations) and
# replaces any name containing "flash" with them, so "flashcore" never reaches FlashCore there (docs/python.md).
ARCH_NAMES = [("mistral", fc_hf.DEFAULT_NAME), ("mistral", fc_hf.FLASH_NAME), ("gemma2", fc_hf.DEFAULT_NAME),
              ("gemma2", fc_hf.FLASH_NAME), ("gpt_oss", fc_hf.DEFAULT_NAME)]


def tiny(arch, attn_implementation, dtype, device, seed=0, **overrides):
    config = _config(arch)
    if config is None:
        pytest.skip(f"transformers {transformers.__version__} has no {arch}")
    for key, value in overrides.items():
        setattr(config, key, value)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    if arch == "gpt_oss":
        # The sinks are initialised near 0 (normal, std 0.02), where they hardly change the softmax: make them matter.
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.copy_(torch.linspace(-2.0, 2.0, config.num_attention_heads))
    model = model.to(device=device, dtype=dtype).eval()
    assert model.config._attn_implementation == attn_implementation
    return model


@pytest.fixture
def calls(monkeypatch):
    """The keyword arguments of every call that reaches flashcore.attention (as opposed to a fallback)."""
    seen = []
    real = fc_hf._ops.attention

    def counted(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(fc_hf._ops, "attention", counted)
    return seen


def _logits(model, ids, mask=None):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits.float()


def compare_with_eager(arch, name, device, ids, mask=None, atol=1e-2, **overrides):
    """max |flashcore - fp32 eager| <= 2 * max |eager at bf16 - fp32 eager| + atol on the unpadded tokens (the
    project's error rule, with the model's own eager attention as the reference). Returns the fp32 eager logits."""
    fc = tiny(arch, name, torch.bfloat16, device, **overrides)
    eager = tiny(arch, "eager", torch.bfloat16, device, **overrides)
    ref = tiny(arch, "eager", torch.float32, device, **overrides)
    ref.load_state_dict({k: v.float() for k, v in eager.state_dict().items()})
    got, base, want = (_logits(m, ids, mask) for m in (fc, eager, ref))
    keep = mask.bool() if mask is not None else torch.ones_like(ids, dtype=torch.bool)
    err = (got - want)[keep].abs().max().item()
    noise = (base - want)[keep].abs().max().item()
    assert err <= 2 * noise + atol, f"{arch} {name}: flashcore logits error {err:.3g} vs eager bf16 {noise:.3g}"
    return want


# The variants each model's two layers pass to FlashCore (Mistral: a window on every layer; Gemma 2 and gpt-oss: a
# sliding layer, then a full one).
VARIANTS = {
    "mistral": ({"window_size": (WINDOW - 1, 0)},) * 2,
    "gemma2": ({"window_size": (WINDOW - 1, 0), "softcap": 0.05}, {"softcap": 0.05}),
    "gpt_oss": ({"window_size": (WINDOW - 1, 0), "sinks": True}, {"sinks": True}),
}


def check_model(arch, name, device, calls):
    ids = torch.randint(0, 1000, (2, 64), device=device)
    want = compare_with_eager(arch, name, device, ids)
    # Every layer ran on FlashCore (the mask builder left the sliding-window mask to the attention function), with the
    # model's variants: window (WINDOW - 1, 0) on sliding layers, softcap / sinks on all.
    assert len(calls) == 2, f"{len(calls)} of 2 layers ran on FlashCore"
    for got, want_kwargs in zip(calls, VARIANTS[arch]):
        assert got.get("window_size") == want_kwargs.get("window_size")
        assert got.get("softcap") == want_kwargs.get("softcap")
        assert (got.get("sinks") is not None) == bool(want_kwargs.get("sinks"))
        assert got.get("causal") is True
    # The variants matter for these weights: without the window (and softcap / sinks) the logits move far more than
    # the tolerance.
    plain = tiny(arch, "eager", torch.float32, device, sliding_window=4096,  # wider than the 64 keys: no window
                 **({"attn_logit_softcapping": None} if arch == "gemma2" else {}))
    if arch == "gpt_oss":
        with torch.no_grad():
            for layer in plain.model.layers:
                layer.self_attn.sinks.fill_(-float("inf"))
    assert (_logits(plain, ids) - want).abs().max().item() > 0.1


def check_generate(arch, name, device, calls, new_tokens=24):
    """Greedy decoding past the window (12 prompt tokens, 24 new: up to 36 keys against a window of 16) with a dynamic
    cache: every prefill and decoding step on FlashCore, logits equal to eager's on the same tokens (teacher-forced, so
    a near-tie cannot make the sequences diverge)."""
    ids = torch.randint(0, 1000, (1, 12), device=device)
    fc = tiny(arch, name, torch.bfloat16, device)
    eager = tiny(arch, "eager", torch.bfloat16, device)
    fc.generation_config.eos_token_id = None  # never stop early: the call count below is exact
    kwargs = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, output_logits=True,
                  return_dict_in_generate=True)
    with torch.no_grad():
        got = fc.generate(ids, **kwargs)
        want = eager(input_ids=got.sequences).logits[:, ids.shape[1] - 1:-1].float()
    assert len(calls) == 2 * new_tokens
    diff = (torch.stack(got.logits, dim=1).float() - want).abs().max().item()
    assert diff < 5e-2, f"decoding logits differ from eager by {diff}"


# ---------------------------------------------------------------------------------------------------------------
# CPU: the kernel emulated.


@pytest.fixture
def emulated(monkeypatch):
    emulate_on_cpu(monkeypatch)
    monkeypatch.setattr(fc_hf, "_is_cuda", lambda t: True)
    monkeypatch.setattr(fc_hf, "_compiled_head_dims", lambda: (64, 128, 256))
    monkeypatch.setattr(fc_hf, "_compiled_backward_head_dims", lambda: (64, 128))
    monkeypatch.setattr(fc_hf, "_library_has_variants", lambda: True)
    monkeypatch.setattr(fc_hf, "_library_has_variant_backward", lambda: True)
    fc_hf._logged_reasons.clear()


@pytest.mark.parametrize("arch, name", ARCH_NAMES)
def test_cpu_emulated_model_matches_eager(emulated, calls, arch, name):
    fc_hf.register(name)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="FlashCore: falling back")  # no layer may fall back
        check_model(arch, name, "cpu", calls)


@pytest.mark.parametrize("arch, name", [("mistral", fc_hf.DEFAULT_NAME), ("gemma2", fc_hf.FLASH_NAME),
                                        ("gpt_oss", fc_hf.DEFAULT_NAME)])
def test_cpu_emulated_generate_past_the_window(emulated, calls, arch, name):
    fc_hf.register(name)
    check_generate(arch, name, "cpu", calls)


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gpt_oss"])
def test_cpu_emulated_padding_falls_back_with_the_variants(emulated, calls, arch):
    """Left padding: every call carries a mask, so it falls back, to the model's eager attention when it has softcap
    or sinks (transformers' SDPA attention would ignore them), and still matches eager."""
    fc_hf.register(fc_hf.DEFAULT_NAME)
    ids = torch.randint(1, 1000, (2, 40))
    mask = torch.ones_like(ids)
    mask[0, :7] = 0
    with pytest.warns(UserWarning, match="falling back to the model's eager attention" if arch != "mistral"
                      else "falling back to transformers' SDPA attention"):
        compare_with_eager(arch, fc_hf.DEFAULT_NAME, "cpu", ids, mask)
    assert calls == []


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_cpu_emulated_fp32_falls_back_with_the_window(emulated, calls, arch):
    """An fp32 model cannot run on FlashCore: with no mask from the builder (a sliding layer without padding) the
    fallback builds the window's mask itself; logits as eager's."""
    fc_hf.register(fc_hf.DEFAULT_NAME)
    ids = torch.randint(0, 1000, (1, 48))
    fc = tiny(arch, fc_hf.DEFAULT_NAME, torch.float32, "cpu")
    ref = tiny(arch, "eager", torch.float32, "cpu")
    with pytest.warns(UserWarning, match="dtype torch.float32"):
        got = _logits(fc, ids)
    torch.testing.assert_close(got, _logits(ref, ids), atol=1e-4, rtol=1e-4)
    assert calls == []


def check_training(arch, name, device, calls, ids, atol):
    """One training step (forward and backward) of FlashCore's model against the model's eager attention at bf16 and
    in fp32 (same weights): every layer ran on FlashCore with its variants and inputs that require grad, and for every
    parameter, gpt-oss's sinks included, max |grad(flashcore) - grad(fp32 eager)| <= 2 * max |grad(bf16 eager) -
    grad(fp32 eager)| + atol * max |grad(fp32 eager)| (the project's error rule, on gradients; as test_transformers.py's
    compare_grads)."""
    fc = tiny(arch, name, torch.bfloat16, device).train()
    eager = tiny(arch, "eager", torch.bfloat16, device).train()
    ref = tiny(arch, "eager", torch.float32, device).train()
    ref.load_state_dict({k: v.float() for k, v in eager.state_dict().items()})
    for model in (fc, eager, ref):
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
    assert len(calls) == 2, f"{len(calls)} of 2 layers ran on FlashCore"
    for got, want_kwargs in zip(calls, VARIANTS[arch]):
        assert got.get("window_size") == want_kwargs.get("window_size")
        assert got.get("softcap") == want_kwargs.get("softcap")
        assert (got.get("sinks") is not None) == bool(want_kwargs.get("sinks"))
    ref_params = dict(ref.named_parameters())
    names = []
    for (pname, p_fc), (_, p_eager) in zip(fc.named_parameters(), eager.named_parameters()):
        want = ref_params[pname].grad.float()
        assert p_fc.grad is not None, f"{pname}: no gradient"
        err = (p_fc.grad.float() - want).abs().max().item()
        base = (p_eager.grad.float() - want).abs().max().item()
        assert err <= 2 * base + atol * want.abs().max().item(), f"{pname}: flashcore {err:.3g}, eager bf16 {base:.3g}"
        names.append(pname)
    if arch == "gpt_oss":  # the sinks are a parameter: their gradient came from FlashCore's dsinks
        assert any(n.endswith("self_attn.sinks") for n in names)


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gpt_oss"])
def test_cpu_emulated_training_with_variants_runs_flashcore(emulated, calls, arch):
    """A training step whose attention has variants (a window, softcap, sinks that require grad) runs on FlashCore's
    forward and backward since 0.6 (no fallback, no warning), and its gradients (gpt-oss's sinks included) follow the
    error rule against the model's eager attention."""
    fc_hf.register(fc_hf.DEFAULT_NAME)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="FlashCore: falling back")
        check_training(arch, fc_hf.DEFAULT_NAME, "cpu", calls, torch.randint(0, 1000, (2, 40)), atol=2e-2)


@pytest.mark.parametrize("strict", [False, True])
def test_cpu_emulated_training_with_a_05_library_falls_back(emulated, calls, monkeypatch, strict):
    """A library whose backward does not take the variants (0.5: forward only): a training step with them runs on
    transformers' attention, with a warning naming them and the version (strict: ValueError), not a forward whose
    backward then fails; its gradients are eager's. Without gradients the same calls stay on FlashCore."""
    monkeypatch.setattr(fc_hf, "_library_has_variant_backward", lambda: False)
    fc_hf.register(fc_hf.DEFAULT_NAME, fallback=not strict)
    try:
        ids = torch.randint(0, 1000, (2, 40))
        fc_hf._logged_reasons.clear()
        if strict:
            fc = tiny("mistral", fc_hf.DEFAULT_NAME, torch.bfloat16, "cpu").train()
            with pytest.raises(ValueError, match=r"gradients with sliding_window \(.*0.6 needed\)"):
                fc(input_ids=ids, labels=ids)
            return
        fc = tiny("gemma2", fc_hf.DEFAULT_NAME, torch.bfloat16, "cpu").train()
        ref = tiny("gemma2", "eager", torch.bfloat16, "cpu").train()
        with pytest.warns(UserWarning, match=r"gradients with sliding_window, softcap \(the loaded libflashcore.so's "
                                             r"backward predates the attention variants: 0.6 needed\)"):
            fc(input_ids=ids, labels=ids).loss.backward()
        ref(input_ids=ids, labels=ids).loss.backward()
        assert calls == []
        for (name, p_fc), (_, p_ref) in zip(fc.named_parameters(), ref.named_parameters()):
            scale = p_ref.grad.float().abs().max().item()
            torch.testing.assert_close(p_fc.grad.float(), p_ref.grad.float(), atol=1e-2 * scale, rtol=0, msg=name)
        _logits(fc, ids)  # no gradients: FlashCore
        assert len(calls) == 2
    finally:
        fc_hf.register(fc_hf.DEFAULT_NAME)


def test_cpu_emulated_mask_builder_keeps_chunked_masks(emulated):
    """The builder returns None for a causal sliding window only; a chunked mask (same local_size argument) is built,
    as is a sliding one with padding or a mask function on top."""
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    config = transformers.MistralConfig(**{k: v for k, v in COMMON.items()})
    # 32 keys, more than the window: transformers' sdpa_mask then builds the mask (with fewer it skips it itself).
    common = dict(batch_size=1, q_length=32, kv_length=32, q_offset=0, kv_offset=0, attention_mask=None,
                  allow_is_causal_skip=True, dtype=torch.float32, device="cpu")
    sliding = dict(mask_function=sliding_window_causal_mask_function(WINDOW), local_size=WINDOW)
    assert fc_hf.mask_function(config=config, **sliding, **common) is None
    assert fc_hf.mask_function(config=config, mask_function=causal_mask_function, **common) is None
    chunked = transformers.MistralConfig(**{k: v for k, v in COMMON.items()})
    chunked.attention_chunk_size = WINDOW
    assert fc_hf.mask_function(config=chunked, **sliding, **common) is not None
    assert fc_hf.mask_function(config=config, **dict(sliding, local_size=WINDOW + 1), **common) is not None
    assert fc_hf.mask_function(config=None, **sliding, **common) is not None
    padded = dict(common, attention_mask=torch.arange(32)[None] >= 3)
    assert fc_hf.mask_function(config=config, **sliding, **padded) is not None
    assert fc_hf.mask_function(config=config, **sliding, **dict(common, allow_is_causal_skip=False)) is not None


@pytest.mark.parametrize("strict", [False, True])
def test_cpu_emulated_library_without_variants_falls_back(emulated, calls, monkeypatch, strict):
    """A 0.4 library (no variant fields): calls with a window, softcap or sinks go to transformers' attention (eager,
    for softcap and sinks), naming the reason, instead of the op's RuntimeError; plain calls stay on FlashCore."""
    monkeypatch.setattr(fc_hf, "_library_has_variants", lambda: False)
    fc_hf.register(fc_hf.DEFAULT_NAME, fallback=not strict)
    try:
        ids = torch.randint(0, 1000, (1, 40))
        for arch in ("mistral", "gemma2"):
            fc_hf._logged_reasons.clear()
            if strict:
                with pytest.raises(ValueError, match="predates the attention variants"):
                    _logits(tiny(arch, fc_hf.DEFAULT_NAME, torch.bfloat16, "cpu"), ids)
            else:
                with pytest.warns(UserWarning, match="predates the attention variants: 0.5 needed"):
                    compare_with_eager(arch, fc_hf.DEFAULT_NAME, "cpu", ids)
        assert calls == []
        _logits(tiny("mistral", fc_hf.DEFAULT_NAME, torch.bfloat16, "cpu"), ids[:, :WINDOW])  # the window hides nothing
        assert len(calls) == 2
    finally:
        fc_hf.register(fc_hf.DEFAULT_NAME)


def test_cpu_emulated_window_conventions_on_direct_calls(emulated, calls):
    """Direct calls of the attention function: a window that hides keys becomes window_size=(N - 1, 0), also on a
    decoding step (Sq = 1); one as wide as the keys is not passed."""
    from reference import reference_variants

    module = torch.nn.Module()
    module.is_causal = True
    torch.manual_seed(0)
    q = torch.randn(1, 4, 20, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 20, 64, dtype=torch.bfloat16) for _ in range(2))
    out, _ = fc_hf.attention_forward(module, q, k, v, None, sliding_window=6)
    want, _ = reference_variants(*(t.transpose(1, 2) for t in (q, k, v)), True, None, (5, 0))
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    out, _ = fc_hf.attention_forward(module, q[:, :, -1:], k, v, None, sliding_window=6)  # decoding: the last 6 keys
    want, _ = reference_variants(*(t.transpose(1, 2) for t in (q[:, :, -1:], k[:, :, -6:], v[:, :, -6:])), False)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    fc_hf.attention_forward(module, q, k, v, None, sliding_window=20)
    assert [c.get("window_size") for c in calls] == [(5, 0), (5, 0), None]
    assert [c.get("causal") for c in calls] == [True, False, True]


# ---------------------------------------------------------------------------------------------------------------
# GPU: the real kernels (a 0.5 library).


@pytest.fixture(scope="module")
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to PyTorch")
    try:
        caps = flashcore.capabilities()
    except RuntimeError as exc:
        pytest.skip(f"libflashcore.so not loadable: {exc}")
    if not caps.device_supported or "bfloat16" not in caps.dtypes or 64 not in caps.head_dims:
        pytest.skip(f"the library cannot run bf16 / head_dim 64 here ({caps})")
    if not fc_hf._lib.load().has_variants():
        pytest.skip(f"{flashcore.library_path()} ({flashcore.library_version()}) predates the attention variants "
                    "(0.5 needed)")
    return "cuda"


@pytest.mark.parametrize("arch, name", ARCH_NAMES)
def test_gpu_model_matches_eager(gpu, calls, arch, name):
    fc_hf.register(name)
    fc_hf._logged_reasons.clear()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="FlashCore: falling back")
        check_model(arch, name, gpu, calls)


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gpt_oss"])
def test_gpu_generate_past_the_window(gpu, calls, arch):
    fc_hf.register(fc_hf.DEFAULT_NAME)
    check_generate(arch, fc_hf.DEFAULT_NAME, gpu, calls)


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gpt_oss"])
def test_gpu_training_with_variants(gpu, calls, arch):
    """A training step with the variants on the real kernels (a 0.6 library): gradients against eager's, the rule of
    check_training."""
    if not fc_hf._lib.load().has_variant_backward():
        pytest.skip(f"{flashcore.library_path()} ({flashcore.library_version()}) has no backward for the variants "
                    "(0.6 needed)")
    fc_hf.register(fc_hf.DEFAULT_NAME)
    fc_hf._logged_reasons.clear()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="FlashCore: falling back")
        check_training(arch, fc_hf.DEFAULT_NAME, gpu, calls, torch.randint(0, 1000, (4, 128), device=gpu), atol=1e-2)


@pytest.mark.parametrize("arch", ["gemma2", "gpt_oss"])
def test_gpu_padding_falls_back_to_eager(gpu, calls, arch):
    fc_hf.register(fc_hf.DEFAULT_NAME)
    ids = torch.randint(1, 1000, (2, 40), device=gpu)
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    compare_with_eager(arch, fc_hf.DEFAULT_NAME, gpu, ids, mask)
    assert calls == []
