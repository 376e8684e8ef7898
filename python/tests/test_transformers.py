"""The transformers adapter: a tiny randomly initialised Llama (no downloads) with FlashCore vs SDPA."""

import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import flashcore  # noqa: E402
import flashcore.integrations.transformers as fc_hf  # noqa: E402
from reference import emulate_on_cpu  # noqa: E402


def tiny_llama(attn_implementation, dtype, device, seed=0):
    config = transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=1000,
        max_position_embeddings=512,
    )
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    assert model.config._attn_implementation == attn_implementation
    return model


@pytest.fixture
def count_calls(monkeypatch):
    """Counts the calls that reach flashcore (as opposed to the SDPA fallback)."""
    calls = []
    real = fc_hf._ops.attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(fc_hf._ops, "attention", counted)
    return calls


NAMES = [fc_hf.DEFAULT_NAME, fc_hf.FLASH_NAME]  # "fcore", "flashcore"


def test_register_refuses_other_names_with_flash():
    for name in ("flash_core", "FlashCore", "my-flash"):
        with pytest.raises(ValueError, match="flash"):
            fc_hf.register(name)


def test_register_flashcore_needs_transformers_5(monkeypatch):
    """The "flashcore" workaround wraps a transformers 5.x internal: other versions are refused, pointing to "fcore"."""
    import transformers.modeling_flash_attention_utils as mfau

    monkeypatch.setattr(mfau, "_lazy_imports", getattr(mfau._lazy_imports, "_flashcore_original", mfau._lazy_imports))
    monkeypatch.setattr(transformers, "__version__", "4.57.0")
    with pytest.raises(RuntimeError, match="fcore"):
        fc_hf.register(fc_hf.FLASH_NAME)


@pytest.mark.parametrize("name", NAMES)
def test_register(name):
    assert fc_hf.register(name) == name
    assert transformers.AttentionInterface._global_mapping[name] is fc_hf.attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    assert AttentionMaskInterface._global_mapping[name] is fc_hf.mask_function
    assert fc_hf.register() == fc_hf.DEFAULT_NAME


def test_flashcore_lazy_import_is_scoped_to_flashcore(monkeypatch):
    """transformers' FlashAttention import for "flashcore" loads nothing (no hub kernel); other names are untouched,
    and so is "flashcore" once it is registered to something else."""
    import transformers.modeling_flash_attention_utils as mfau
    from transformers.modeling_flash_attention_utils import lazy_import_flash_attention
    from transformers.utils.generic import is_flash_attention_requested

    fc_hf.register(fc_hf.FLASH_NAME)
    assert is_flash_attention_requested(requested_attention_implementation=fc_hf.FLASH_NAME)  # why this is needed
    (fn, varlen_fn, kvcache_fn, _, _), _ = lazy_import_flash_attention(fc_hf.FLASH_NAME)
    assert kvcache_fn is None
    with pytest.raises(NotImplementedError, match="not a FlashAttention kernel"):
        varlen_fn(None, None, None, None, None, 0, 0)
    with pytest.raises(Exception, match="flash_other|kernels"):
        lazy_import_flash_attention("flash_other")
    # lazy_import_flash_attention caches the last requested name (even when loading it failed): forget it.
    monkeypatch.setattr(mfau, "_loaded_implementation", None)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    transformers.AttentionInterface.register(fc_hf.FLASH_NAME, sdpa_attention_forward)
    try:
        monkeypatch.setattr(mfau, "_loaded_implementation", None)
        with pytest.raises(Exception, match="flashcore|kernels"):
            lazy_import_flash_attention(fc_hf.FLASH_NAME)
    finally:
        fc_hf.register(fc_hf.FLASH_NAME)


def compare_logits(device, dtype, name, input_ids, attention_mask=None, atol=1e-2):
    """max |flashcore - fp32 SDPA| <= 2 * max |SDPA same dtype - fp32 SDPA| + atol, on the unpadded tokens."""
    fc = tiny_llama(name, dtype, device)
    sdpa = tiny_llama("sdpa", dtype, device)
    ref = tiny_llama("sdpa", torch.float32, device)
    ref.load_state_dict({k: v.float() for k, v in sdpa.state_dict().items()})
    with torch.no_grad():
        logits = [m(input_ids=input_ids, attention_mask=attention_mask).logits.float() for m in (fc, sdpa, ref)]
    keep = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    err = (logits[0] - logits[2])[keep].abs().max().item()
    base = (logits[1] - logits[2])[keep].abs().max().item()
    assert err <= 2 * base + atol, f"flashcore logits error {err:.3g} vs SDPA {dtype} {base:.3g}"
    return fc


# ---------------------------------------------------------------------------------------------------------------
# CPU: the adapter's wiring, with the kernel emulated (no GPU needed).


@pytest.fixture(params=NAMES)
def emulated_adapter(request, monkeypatch):
    emulate_on_cpu(monkeypatch)
    monkeypatch.setattr(fc_hf, "_is_cuda", lambda t: True)
    monkeypatch.setattr(fc_hf, "_compiled_head_dims", lambda: (64, 128, 256))
    monkeypatch.setattr(fc_hf, "_compiled_backward_head_dims", lambda: (64, 128))
    monkeypatch.setattr(fc_hf, "_library_has_variants", lambda: True)
    monkeypatch.setattr(fc_hf, "_compiled_head_dim_pairs", lambda: ((192, 128),))
    monkeypatch.setattr(fc_hf, "_compiled_backward_head_dim_pairs", lambda: ())  # the portable backend's: none
    return fc_hf.register(request.param)


def test_cpu_emulated_prefill_uses_flashcore(emulated_adapter, count_calls):
    ids = torch.randint(0, 1000, (2, 37))
    compare_logits("cpu", torch.bfloat16, emulated_adapter, ids)
    assert len(count_calls) == 2  # one call per layer, GQA shapes untouched
    assert count_calls[0] == (2, 37, 4, 64)


def test_cpu_emulated_padding_falls_back(emulated_adapter, count_calls):
    ids = torch.randint(0, 1000, (2, 21))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding
    compare_logits("cpu", torch.bfloat16, emulated_adapter, ids, mask)
    assert count_calls == []


def check_generate(name, device, count_calls, new_tokens=6):
    """Greedy decoding with a dynamic cache: prefill and every decoding step run on flashcore."""
    ids = torch.randint(0, 1000, (1, 12), device=device)
    fc = tiny_llama(name, torch.bfloat16, device)
    sdpa = tiny_llama("sdpa", torch.bfloat16, device)
    fc.generation_config.eos_token_id = None  # never stop early: the call count below is exact
    kwargs = dict(
        max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True
    )
    with torch.no_grad():
        got = fc.generate(ids, **kwargs)
        # Score the same tokens with SDPA: teacher-forced, so a near-tie cannot make the sequences diverge.
        want = sdpa(input_ids=got.sequences).logits[:, ids.shape[1] - 1 : -1].float()
    assert len(count_calls) == 2 * new_tokens
    diff = (torch.stack(got.logits, dim=1).float() - want).abs().max().item()
    assert diff < 5e-2, f"decoding logits differ from SDPA by {diff}"


def test_cpu_emulated_generate_matches_sdpa(emulated_adapter, count_calls):
    check_generate(emulated_adapter, "cpu", count_calls)


def test_cpu_emulated_set_attn_implementation(emulated_adapter, count_calls):
    """Switching an existing SDPA model to FlashCore (the other way transformers validates a name)."""
    model = tiny_llama("sdpa", torch.bfloat16, "cpu")
    model.set_attn_implementation(emulated_adapter)
    assert model.config._attn_implementation == emulated_adapter
    with torch.no_grad():
        model(input_ids=torch.randint(0, 1000, (1, 9)))
    assert len(count_calls) == 2


def test_cpu_emulated_padded_generate_falls_back(emulated_adapter, count_calls):
    """Left-padded batched generation: every call carries a padding mask, so all of it runs on SDPA, same tokens."""
    ids = torch.randint(1, 1000, (2, 10))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    ids[0, :4] = 0
    fc = tiny_llama(emulated_adapter, torch.float32, "cpu")
    sdpa = tiny_llama("sdpa", torch.float32, "cpu")
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        got = fc.generate(ids, attention_mask=mask, **kwargs)
        want = sdpa.generate(ids, attention_mask=mask, **kwargs)
    assert torch.equal(got, want)
    assert count_calls == []


def test_cpu_emulated_packed_sequences(emulated_adapter, count_calls):
    """cu_seq_lens_q / cu_seq_lens_k (what model code passes to "flash" implementations, e.g. VL vision towers):
    one FlashCore call per segment, equal to attention over each segment on its own."""
    from reference import reference

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 20, 64, dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 5, 12, 20], dtype=torch.int32)
    module = torch.nn.Module()
    for causal in (False, True):
        count_calls.clear()
        out, _ = fc_hf.attention_forward(
            module, q, k, v, None, is_causal=causal, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=8, max_length_k=8
        )
        assert out.shape == (1, 20, 4, 64) and len(count_calls) == 3
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
            want, _ = reference(*(t[:, :, a:b].transpose(1, 2) for t in (q, k, v)), causal=causal)
            torch.testing.assert_close(out[:, a:b].float(), want.float(), atol=2e-2, rtol=2e-2)
    q2, k2, v2 = (t.expand(2, -1, -1, -1) for t in (q, k, v))
    with pytest.raises(ValueError, match="batch size 2"):
        fc_hf.attention_forward(module, q2, k2, v2, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)


def test_strict_mode_raises(emulated_adapter):
    fc_hf.register(emulated_adapter, fallback=False)
    try:
        model = tiny_llama(emulated_adapter, torch.float32, "cpu")
        ids = torch.randint(0, 1000, (2, 9))
        mask = torch.ones_like(ids)
        mask[1, :3] = 0
        with pytest.raises(ValueError, match="not purely causal"), torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
    finally:
        fc_hf.register(emulated_adapter)


# ---------------------------------------------------------------------------------------------------------------
# Training (since 0.4): the backward.


def compare_grads(fc, sdpa, ref, input_ids, atol):
    """One forward and backward of three models with the same weights (FlashCore, SDPA at the same dtype, fp32 SDPA):
    for every parameter, max |grad(flashcore) - grad(ref)| <= 2 * max |grad(SDPA) - grad(ref)| + atol * max |grad(ref)|
    (the project's error rule, on gradients). Returns the losses."""
    losses = []
    for model in (fc, sdpa, ref):
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        losses.append(loss.item())
    ref_params = dict(ref.named_parameters())
    for (name, p_fc), (_, p_sdpa) in zip(fc.named_parameters(), sdpa.named_parameters()):
        want = ref_params[name].grad.float()
        err = (p_fc.grad.float() - want).abs().max().item()
        base = (p_sdpa.grad.float() - want).abs().max().item()
        assert err <= 2 * base + atol * want.abs().max().item(), f"{name}: flashcore {err:.3g}, SDPA {base:.3g}"
    return losses


def _three_models(name, device):
    fc = tiny_llama(name, torch.bfloat16, device).train()
    sdpa = tiny_llama("sdpa", torch.bfloat16, device).train()
    ref = tiny_llama("sdpa", torch.float32, device).train()
    ref.load_state_dict({k: v.float() for k, v in sdpa.state_dict().items()})
    return fc, sdpa, ref


def test_cpu_emulated_training_step(emulated_adapter, count_calls):
    """Gradients of a training step go through FlashCore's backward (emulated), for every layer, and match SDPA's."""
    fc, sdpa, ref = _three_models(emulated_adapter, "cpu")
    ids = torch.randint(0, 1000, (2, 33))
    compare_grads(fc, sdpa, ref, ids, atol=2e-2)
    assert len(count_calls) == 2  # both layers ran on FlashCore, with inputs that require grad
    optimizer = torch.optim.AdamW(fc.parameters(), lr=1e-3)
    optimizer.step()  # the gradients are usable as they are (dtype, layout)


@pytest.mark.parametrize("strict", [False, True])
def test_cpu_emulated_training_without_backward_falls_back(emulated_adapter, count_calls, monkeypatch, strict):
    """A call that will be differentiated but that FlashCore's backward cannot take (a head dim it has no backward
    for, or a library without the backward) runs on SDPA, with a warning naming the reason (strict: ValueError), never
    a forward whose backward then fails. Without gradients the same call stays on FlashCore."""
    fn = fc_hf.strict_attention_forward if strict else fc_hf.attention_forward
    q, k, v = (t.requires_grad_() for t in _attention_inputs(d=256))
    module = _causal_module()
    for dims, needle in (((64, 128), "gradients with head_dim 256"), ((), "no backward pass")):
        monkeypatch.setattr(fc_hf, "_compiled_backward_head_dims", lambda dims=dims: dims)
        fc_hf._logged_reasons.clear()
        if strict:
            with pytest.raises(ValueError, match=needle):
                fn(module, q, k, v, None)
        else:
            with pytest.warns(UserWarning, match=needle):
                out, _ = fn(module, q, k, v, None)
            out.float().sum().backward()
        assert count_calls == []
        with torch.no_grad():
            fn(module, q, k, v, None)
        assert len(count_calls) == 1
        count_calls.clear()


# ---------------------------------------------------------------------------------------------------------------
# Arguments the kernel cannot honour: never plain causal attention in their place.


def _attention_inputs(sq=12, sk=12, d=64, hq=4, hkv=2, dtype=torch.bfloat16):
    torch.manual_seed(0)
    q = torch.randn(1, hq, sq, d, dtype=dtype)
    k, v = (torch.randn(1, hkv, sk, d, dtype=dtype) for _ in range(2))
    return q, k, v


def _causal_module():
    module = torch.nn.Module()
    module.is_causal = True
    module.num_key_value_groups = 2  # transformers' SDPA path repeats K/V heads by this
    return module


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(dropout=0.1), "dropout"),
        (dict(sliding_window=4, is_causal=False), "sliding_window=4 in a non-causal module"),
        (dict(sliding_window="4"), "sliding_window='4' \\(not a positive int\\)"),
        (dict(sliding_window=0), "sliding_window=0 \\(not a positive int\\)"),
    ],
)
def test_cpu_emulated_unsupported_arguments_fall_back_or_raise(emulated_adapter, count_calls, kwargs, needle):
    q, k, v = _attention_inputs()
    module = _causal_module()
    fc_hf._logged_reasons.clear()
    kwargs = dict(kwargs)  # the parametrize dict is shared by every adapter name: do not mutate it
    dropout = kwargs.pop("dropout", 0.0)
    # fallback=True: SDPA runs (FlashCore is not called) and a warning names the argument, once.
    with pytest.warns(UserWarning, match=needle):
        try:
            fc_hf.attention_forward(module, q, k, v, None, dropout=dropout, **kwargs)
        except Exception as exc:  # noqa: BLE001  SDPA may refuse an argument itself: fine, it was not ignored
            assert not isinstance(exc, AssertionError)
    assert count_calls == []
    # fallback=False: ValueError naming the argument.
    with pytest.raises(ValueError, match=needle):
        fc_hf.strict_attention_forward(module, q, k, v, None, dropout=dropout, **kwargs)
    assert count_calls == []


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(sinks=torch.zeros(4)), "the 'sinks' argument"),  # no model passes this name: not assumed to be s_aux
        (dict(s_aux=torch.zeros(3)), r"s_aux \(attention sinks\) of shape \(3,\)"),
    ],
)
def test_cpu_emulated_sinks_that_flashcore_cannot_take_need_the_models_eager_attention(emulated_adapter, count_calls,
                                                                                        kwargs, needle):
    """Attention sinks FlashCore cannot take go to the model's eager attention (SDPA would ignore them); a module whose
    model has none (a bare nn.Module here) is a ValueError naming the argument, in both modes, never SDPA."""
    q, k, v = _attention_inputs()
    for fn in (fc_hf.attention_forward, fc_hf.strict_attention_forward):
        with pytest.raises(ValueError, match=needle):
            fn(_causal_module(), q, k, v, None, **kwargs)
    assert count_calls == []


def test_cpu_emulated_sliding_window_wider_than_the_keys_runs_on_flashcore(emulated_adapter, count_calls):
    q, k, v = _attention_inputs(sq=12, sk=12)
    fc_hf.attention_forward(_causal_module(), q, k, v, None, sliding_window=64)
    assert len(count_calls) == 1


def test_cpu_emulated_sliding_window_on_the_module(emulated_adapter, count_calls, monkeypatch):
    """A module's sliding_window attribute counts as the kwarg does: FlashCore runs it as window_size=(3, 0)."""
    q, k, v = _attention_inputs(sq=12, sk=12)
    module = _causal_module()
    module.sliding_window = 4
    seen = []
    real = fc_hf._ops.attention
    monkeypatch.setattr(fc_hf._ops, "attention", lambda *a, **kw: seen.append(kw.get("window_size")) or real(*a, **kw))
    fc_hf.strict_attention_forward(module, q, k, v, None)
    assert seen == [(3, 0)]


def test_cpu_emulated_position_id_packing_runs_per_sequence(emulated_adapter, count_calls):
    """Batch 1, no mask, position_ids restarting at 0: attention within each packed sequence, not across."""
    from reference import reference

    q, k, v = _attention_inputs(sq=12, sk=12)
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]])
    out, _ = fc_hf.attention_forward(_causal_module(), q, k, v, None, position_ids=position_ids)
    assert len(count_calls) == 3
    for a, b in ((0, 5), (5, 8), (8, 12)):
        want, _ = reference(*(t[:, :, a:b].transpose(1, 2) for t in (q, k, v)), causal=True)
        torch.testing.assert_close(out[:, a:b].float(), want.float(), atol=2e-2, rtol=2e-2)
    count_calls.clear()
    fc_hf.attention_forward(_causal_module(), q, k, v, None, position_ids=torch.arange(12)[None])  # not packed
    assert len(count_calls) == 1


def test_cpu_emulated_position_id_packing_while_compiling_is_per_sequence(emulated_adapter, count_calls):
    """Under torch.compile the ids cannot be read: the call must still attend within each packed sequence (SDPA
    with a block-diagonal causal mask), never across them with a plain causal kernel call."""
    from reference import reference

    q, k, v = _attention_inputs(sq=12, sk=12)
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]])
    module = _causal_module()

    def run(q, k, v, ids):
        return fc_hf.attention_forward(module, q, k, v, None, position_ids=ids)[0]

    torch._dynamo.reset()
    out = torch.compile(run, backend="eager")(q, k, v, position_ids)
    assert count_calls == []
    for a, b in ((0, 5), (5, 8), (8, 12)):
        want, _ = reference(*(t[:, :, a:b].transpose(1, 2) for t in (q, k, v)), causal=True)
        torch.testing.assert_close(out[:, a:b].float(), want.float(), atol=2e-2, rtol=2e-2)
    with pytest.raises(Exception, match="position_ids while compiling"):
        torch._dynamo.reset()
        torch.compile(lambda q, k, v, ids: fc_hf.strict_attention_forward(module, q, k, v, None, position_ids=ids)[0],
                      backend="eager")(q, k, v, position_ids)


@pytest.mark.parametrize("strict", [False, True])
def test_cpu_emulated_uncompiled_head_dim_same_in_eager_and_compiled(emulated_adapter, count_calls, strict):
    """head_dim 80 (not compiled): eager and torch.compile take the same path (SDPA fallback, or ValueError)."""
    fn = fc_hf.strict_attention_forward if strict else fc_hf.attention_forward
    q, k, v = _attention_inputs(d=80)
    module = _causal_module()

    def run(q, k, v):
        return fn(module, q, k, v, None)[0]

    torch._dynamo.reset()
    compiled = torch.compile(run, backend="eager")
    if strict:
        for call in (run, compiled):
            with pytest.raises(ValueError, match="head_dim 80"):
                call(q, k, v)
    else:
        eager_out = run(q, k, v)
        torch.testing.assert_close(compiled(q, k, v), eager_out)
    assert count_calls == []


def test_cpu_emulated_value_head_dim_of_its_own(emulated_adapter, count_calls):
    """A value head dim of its own (DeepSeek-V2/V3 MLA: query and key 192, value 128, as the model passes them to an
    attention that is not FlashAttention-2's) runs on FlashCore when the library compiles the pair, with a (B, S, H,
    128) output; a pair it does not compile, and gradients where the backward lacks the pair (here: none, as on the
    portable backend or before 0.9), fall back, or raise ValueError naming them."""
    from reference import reference

    q, k, _ = _attention_inputs(d=192)
    v = torch.randn(1, 2, 12, 128, dtype=torch.bfloat16)
    module = _causal_module()
    out, _ = fc_hf.strict_attention_forward(module, q, k, v, None)
    assert count_calls == [(1, 12, 4, 192)] and out.shape == (1, 12, 4, 128)
    want, _ = reference(*(t.transpose(1, 2) for t in (q, k, v)), causal=True)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    count_calls.clear()
    for args, needle in (((q, k, v[..., :64]), r"\(head_dim, head_dim_v\) = \(192, 64\) \(compiled pairs: "
                                                 r"\[\(192, 128\)\]\)"),
                         ((q.detach().clone().requires_grad_(), k, v),
                          r"gradients with a value head dim of its own \(128, query and key 192")):
        with pytest.raises(ValueError, match=needle):
            fc_hf.strict_attention_forward(module, *args, None)
        fc_hf._logged_reasons.clear()
        with pytest.warns(UserWarning, match=needle):
            fallback, _ = fc_hf.attention_forward(module, *args, None)
        assert fallback.shape == (1, 12, 4, args[2].shape[-1])
    assert count_calls == []
    with pytest.raises(ValueError, match="different head dims for query and key"):
        fc_hf.strict_attention_forward(module, q, k[..., :128], v, None)


@pytest.mark.parametrize("strict", [False, True])
def test_cpu_emulated_value_head_dim_of_its_own_trains(emulated_adapter, count_calls, monkeypatch, strict):
    """Where the backward takes the pair (0.9, the sm90 backend: (192, 128)) a training call runs on FlashCore, forward
    and backward (emulated), with no fallback warning; the gradients are float64 autograd's. A window at 192 runs on
    FlashCore too (the backward takes the variants at every head dim of its own); with a library whose backward took
    them at head dims 64, 96 and 128 only, it falls back, naming it."""
    from reference import reference_grads

    monkeypatch.setattr(fc_hf, "_compiled_backward_head_dims", lambda: (64, 96, 128, 192, 256))
    monkeypatch.setattr(fc_hf, "_compiled_backward_head_dim_pairs", lambda: ((192, 128),))
    monkeypatch.setattr(fc_hf, "_library_has_variant_backward", lambda: True)
    fn = fc_hf.strict_attention_forward if strict else fc_hf.attention_forward
    q, k, _ = _attention_inputs(d=192)
    v = torch.randn(1, 2, 12, 128, dtype=torch.bfloat16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    module = _causal_module()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="FlashCore: falling back")
        out, _ = fn(module, *leaves, None)
    assert count_calls == [(1, 12, 4, 192)] and out.shape == (1, 12, 4, 128)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    out.backward(dout)
    want = reference_grads(*(t.transpose(1, 2) for t in (q, k, v)), dout, causal=True)
    for name, t, w in zip(("dq", "dk", "dv"), leaves, want):
        assert t.grad.shape == t.shape, name
        torch.testing.assert_close(t.grad.transpose(1, 2).double(), w, atol=3e-2, rtol=3e-2,
                                   msg=lambda m: f"{name}: {m}")
    count_calls.clear()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="FlashCore: falling back")
        fn(module, *leaves, None, sliding_window=4)
    assert count_calls == [(1, 12, 4, 192)]
    count_calls.clear()
    monkeypatch.setattr(fc_hf._ops, "BACKWARD_VARIANT_HEAD_DIMS", (64, 96, 128))
    needle = (r"gradients with sliding_window at head_dim 192 \(FlashCore's backward takes them at head dims 64, 96 "
              r"and 128\)")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    fc_hf._logged_reasons.clear()
    if strict:
        with pytest.raises(ValueError, match=needle):
            fn(module, *leaves, None, sliding_window=4)
    else:
        with pytest.warns(UserWarning, match=needle):
            fn(module, *leaves, None, sliding_window=4)
    assert count_calls == []


@pytest.mark.parametrize("head_dim", [96, 192])
def test_cpu_emulated_wide_head_dims_train(emulated_adapter, count_calls, monkeypatch, head_dim):
    """Head dims 96 and 192 train on FlashCore where the backward takes them (0.9, the sm90 backend); with the
    backward dims of the portable backend (64, 128) the same call falls back, naming the head dim. A window at 96 trains
    (the variants' backward takes 64, 96 and 128)."""
    monkeypatch.setattr(fc_hf, "_compiled_head_dims", lambda: (64, 96, 128, 192, 256))
    monkeypatch.setattr(fc_hf, "_library_has_variant_backward", lambda: True)
    module = _causal_module()
    q, k, v = (t.requires_grad_() for t in _attention_inputs(sq=12, sk=12, d=head_dim))
    fc_hf._logged_reasons.clear()
    with pytest.warns(UserWarning, match=rf"gradients with head_dim {head_dim} \(FlashCore's backward: \[64, 128\]\)"):
        fc_hf.attention_forward(module, q, k, v, None)
    assert count_calls == []
    monkeypatch.setattr(fc_hf, "_compiled_backward_head_dims", lambda: (64, 96, 128, 192, 256))
    kwargs = dict(sliding_window=4) if head_dim == 96 else {}
    out, _ = fc_hf.strict_attention_forward(module, q, k, v, None, **kwargs)
    out.float().sum().backward()
    assert count_calls == [(1, 12, 4, head_dim)] and q.grad.shape == q.shape and v.grad.shape == v.shape


# The first flashcore call of a fresh process, made under torch.compile: nothing is cached yet, the library is not
# loaded. Run in a subprocess, since the point is the process state (the head-dims cache, the loaded library, dynamo's
# caches); the library is the host-only stub (head dims 64, 128, 256) through $FLASHCORE_LIBRARY, the kernel emulated.
_FIRST_CALL_COMPILED = r"""
import sys
import pytest
import torch
from flashcore import _lib
import flashcore.integrations.transformers as fc_hf
from reference import emulate_on_cpu, reference

mode = sys.argv[1]  # fallback, strict, or missing (no library: the op's loader error, in both modes)
strict = mode == "strict"
mp = pytest.MonkeyPatch()
if mode == "missing":
    mp.setattr(fc_hf._ops, "_check_device", lambda q, k, v: None)  # the real library check, which fails
else:
    emulate_on_cpu(mp)
mp.setattr(fc_hf, "_is_cuda", lambda t: True)
calls = []
real_attention = fc_hf._ops.attention
mp.setattr(fc_hf._ops, "attention", lambda *a, **k: calls.append(a[0].shape) or real_attention(*a, **k))
assert _lib._library is None and fc_hf._head_dims_cache == (None, None), "not the process's first flashcore call"

torch.manual_seed(0)
q = torch.randn(1, 4, 12, 80, dtype=torch.bfloat16)
k, v = (torch.randn(1, 2, 12, 80, dtype=torch.bfloat16) for _ in range(2))
module = torch.nn.Module()
module.is_causal = True
module.num_key_value_groups = 2
fn = fc_hf.strict_attention_forward if strict else fc_hf.attention_forward

def run(q, k, v):
    return fn(module, q, k, v, None)[0]

compiled = torch.compile(run, backend="eager")
if mode == "missing":
    for name, call in (("compiled", compiled), ("eager", run)):
        try:
            call(q, k, v)
        except RuntimeError as exc:
            assert type(exc) is RuntimeError and "could not be loaded" in str(exc), f"{name}: {exc!r}"
        else:
            raise AssertionError(f"{name}: no error without a library")
    print("FIRST-CALL-OK")
    sys.exit(0)
if strict:
    for name, call in (("compiled", compiled), ("eager", run)):
        try:
            call(q, k, v)
        except Exception as exc:  # dynamo may wrap what it re-raises
            assert "unsupported call: head_dim 80" in str(exc), f"{name}: {type(exc).__name__}: {exc}"
        else:
            raise AssertionError(f"{name}: no error for head_dim 80 in strict mode")
else:
    got = compiled(q, k, v)  # the first call: must fall back to SDPA, as eager does
    eager = run(q, k, v)
    torch.testing.assert_close(got, eager)
    want, _ = reference(*(t.transpose(1, 2) for t in (q, k, v)), causal=True)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
assert calls == [], f"flashcore was called: {calls}"
assert fc_hf._head_dims_cache[1] == (64, 128, 256), fc_hf._head_dims_cache
print("FIRST-CALL-OK")
"""


def _run_first_call_compiled(mode, library):
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    env = dict(os.environ, FLASHCORE_LIBRARY=library)
    env["PYTHONPATH"] = os.pathsep.join([str(tests.parent), str(tests), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", _FIRST_CALL_COMPILED, mode],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0 and "FIRST-CALL-OK" in result.stdout, (
        f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-6000:]}"
    )


@pytest.mark.parametrize("mode", ["fallback", "strict"])
def test_first_call_compiled_uncompiled_head_dim_matches_eager(stub_library, mode):
    """A process whose first flashcore call happens under torch.compile, with head_dim 80 (not compiled), takes
    the eager decision: SDPA fallback (or, strict, the adapter's ValueError), never a flashcore call that fails."""
    _run_first_call_compiled(mode, stub_library)


def test_first_call_compiled_without_library_raises_as_eager(tmp_path):
    """No library: the first call, compiled or eager, raises the loader's RuntimeError (no silent fallback)."""
    _run_first_call_compiled("missing", str(tmp_path / "libflashcore.so"))


def test_compiled_head_dims_are_cached_for_compiled_graphs(monkeypatch):
    """While compiling, the head dims come from the cache filled by an eager call (no library call in the graph)."""

    class FakeLib:
        @staticmethod
        def compiled():
            return ("bfloat16",), (64,)

        @staticmethod
        def has_backward():
            return True

        @staticmethod
        def has_variants():
            return False

        @staticmethod
        def has_variant_backward():
            return False

        @staticmethod
        def compiled_head_dim_pairs():
            return ((192, 128),)

    fake = FakeLib()
    monkeypatch.setattr(fc_hf._lib, "load", lambda: fake)
    monkeypatch.setattr(fc_hf, "_head_dims_cache", (None, None))
    assert fc_hf._compiled_head_dims() == (64,)
    monkeypatch.setattr(fc_hf.torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(fc_hf._lib, "load", lambda: pytest.fail("library loaded while compiling"))
    assert fc_hf._compiled_head_dims() == (64,)
    assert fc_hf._compiled_backward_head_dims() == (64,)
    assert fc_hf._library_has_variants() is False
    assert fc_hf._library_has_variant_backward() is False
    assert fc_hf._compiled_head_dim_pairs() == ((192, 128),)


def _fake_library(version, arch, head_dims, pairs):
    """A stand-in for the loaded library: its version, compiled head dims and (head_dim, head_dim_v) pairs, every
    backward feature, and the device's compute capability."""

    class FakeLib:
        def __init__(self):
            self.version = version

        @staticmethod
        def compiled():
            return ("bfloat16",), head_dims

        @staticmethod
        def has_backward():
            return True

        @staticmethod
        def has_variants():
            return True

        @staticmethod
        def has_variant_backward():
            return True

        @staticmethod
        def compiled_head_dim_pairs():
            return pairs

        @staticmethod
        def capabilities():
            return type("Caps", (), {"device_arch": arch})()

    return FakeLib()


@pytest.mark.parametrize("version,arch,backend,compiled,expected,pairs", [
    ((0, 9, 0), 90, "", (64, 96, 128, 192, 256), (64, 96, 128, 192, 256), ((192, 128),)),  # 0.9 on Hopper: sm90
    ((0, 9, 0), 90, "", (64, 128, 256), (64, 128, 256), ((192, 128),)),                    # a build without 96, 192
    ((0, 9, 0), 90, "sm80", (64, 96, 128, 192, 256), (64, 128), ()),  # the portable backend forced: 64 and 128 only
    ((0, 9, 0), 86, "", (64, 96, 128, 192, 256), (64, 128), ()),      # an Ampere GPU: the portable backend
    ((0, 8, 0), 90, "", (64, 96, 128, 192, 256), (64, 128), ()),      # a library before 0.9
])
def test_backward_head_dims_and_pairs_follow_library_and_device(monkeypatch, version, arch, backend, compiled,
                                                                 expected, pairs):
    """Head dims 96, 192, 256 and the pair (192, 128) train on FlashCore only where their backward exists (0.9, the
    sm90 backend) and the build compiles them; elsewhere the adapter falls back to SDPA before the forward instead of
    failing in the backward."""
    fake = _fake_library(version, arch, compiled, ((192, 128), (64, 128)))  # one pair the backward takes, one never
    monkeypatch.setattr(fc_hf._lib, "load", lambda: fake)
    monkeypatch.setattr(fc_hf, "_head_dims_cache", (None, None))
    if backend:
        monkeypatch.setenv("FLASHCORE_BACKEND", backend)
    else:
        monkeypatch.delenv("FLASHCORE_BACKEND", raising=False)
    assert fc_hf._compiled_backward_head_dims() == expected
    assert fc_hf._compiled_backward_head_dim_pairs() == pairs
    assert fc_hf._compiled_head_dim_pairs() == ((192, 128), (64, 128))


# ---------------------------------------------------------------------------------------------------------------
# GPU: the real kernel.


@pytest.fixture(scope="module", params=NAMES)
def gpu_name(request):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to PyTorch")
    try:
        caps = flashcore.capabilities()
    except RuntimeError as exc:
        pytest.skip(f"libflashcore.so not loadable: {exc}")
    if not caps.device_supported or "bfloat16" not in caps.dtypes or 64 not in caps.head_dims:
        pytest.skip(f"the library cannot run bf16 / head_dim 64 here ({caps})")
    return fc_hf.register(request.param)


def test_gpu_llama_logits_match_sdpa(gpu_name, count_calls):
    ids = torch.randint(0, 1000, (2, 77), device="cuda")
    compare_logits("cuda", torch.bfloat16, gpu_name, ids)
    assert len(count_calls) == 2


def test_gpu_llama_with_padding_matches_sdpa(gpu_name):
    ids = torch.randint(0, 1000, (2, 40), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    compare_logits("cuda", torch.bfloat16, gpu_name, ids, mask)


def test_gpu_llama_generate(gpu_name, count_calls):
    check_generate(gpu_name, "cuda", count_calls)


def test_gpu_llama_compiled_fullgraph(gpu_name, count_calls):
    torch._dynamo.reset()
    model = tiny_llama(gpu_name, torch.bfloat16, "cuda")
    ids = torch.randint(0, 1000, (2, 64), device="cuda")
    with torch.no_grad():
        eager = model(input_ids=ids, use_cache=False).logits
        compiled = torch.compile(model, fullgraph=True)(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(compiled.float(), eager.float(), atol=2e-2, rtol=2e-2)


# ---------------------------------------------------------------------------------------------------------------
# GPU training: the real backward (a 0.4 library with flashcore_attention_backward).


@pytest.fixture(scope="module")
def gpu_train_name(gpu_name):
    if not fc_hf._lib.load().has_backward():
        pytest.skip(f"{flashcore.library_path()} ({flashcore.library_version()}) has no backward (0.4 needed)")
    return gpu_name


def test_gpu_llama_training_step_grads_match_sdpa(gpu_train_name, count_calls):
    fc, sdpa, ref = _three_models(gpu_train_name, "cuda")
    ids = torch.randint(0, 1000, (4, 128), device="cuda")
    compare_grads(fc, sdpa, ref, ids, atol=1e-2)
    assert len(count_calls) == 2


TRAIN_STEPS, TRAIN_WINDOW = 150, 25
_sdpa_curves = {}


def train_curve(name, steps=TRAIN_STEPS, backend=None):
    """Per-step losses of the tiny Llama (bf16, seed 0) trained with AdamW (lr 1e-3) on 8 fixed batches of random
    tokens (4 x 128, seed 1), cycled: the model can only lower the loss by memorising them, through attention."""
    import contextlib

    from torch.nn.attention import sdpa_kernel

    model = tiny_llama(name, torch.bfloat16, "cuda").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(1)
    data = torch.randint(0, 1000, (8, 4, 128), device="cuda", generator=gen)
    losses = []
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        for step in range(steps):
            ids = data[step % len(data)]
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
    return torch.stack(losses).float().cpu()


def _windows(curve):
    return curve.reshape(-1, TRAIN_WINDOW).mean(dim=1)


def test_gpu_llama_training_matches_sdpa(gpu_train_name, count_calls):
    """150 AdamW steps with attn_implementation=flashcore and with sdpa, same init and data: the loss curves agree.

    bf16 training is chaotic: any difference in rounding (FlashCore's kernels or another SDPA backend) makes two runs
    drift apart slowly, so steps are not compared one by one. The rule, on the means of 25-step windows: |FlashCore -
    SDPA| <= 2 * (the largest window gap between SDPA's default backend and its math backend, two correct bf16
    attentions that round differently) + 1% of the loss. And the run must have learnt something (the last window at
    least 0.5 below the first), so that a backward that lost the attention gradients would show."""
    from torch.nn.attention import SDPBackend

    if "sdpa" not in _sdpa_curves:
        _sdpa_curves["sdpa"] = train_curve("sdpa")
        _sdpa_curves["math"] = train_curve("sdpa", backend=SDPBackend.MATH)
    sdpa, math_backend = _windows(_sdpa_curves["sdpa"]), _windows(_sdpa_curves["math"])
    fc = _windows(train_curve(gpu_train_name))
    assert len(count_calls) == 2 * TRAIN_STEPS
    noise = (math_backend - sdpa).abs().max().item()
    gap = (fc - sdpa).abs()
    assert torch.all(gap <= 2 * noise + 0.01 * sdpa), (
        f"window means: flashcore {fc.tolist()}, sdpa {sdpa.tolist()}, sdpa math {math_backend.tolist()}")
    assert fc[-1] < fc[0] - 0.5, f"flashcore did not learn: window means {fc.tolist()}"

