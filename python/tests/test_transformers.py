"""The transformers adapter: a tiny randomly initialised Llama (no downloads) with FlashCore vs SDPA."""

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


def test_register_refuses_names_with_flash():
    with pytest.raises(ValueError, match="flash"):
        fc_hf.register("flashcore")


def test_register():
    name = fc_hf.register()
    assert name == fc_hf.DEFAULT_NAME
    assert transformers.AttentionInterface._global_mapping[name] is fc_hf.attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    assert AttentionMaskInterface._global_mapping[name] is fc_hf.mask_function


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


@pytest.fixture
def emulated_adapter(monkeypatch):
    emulate_on_cpu(monkeypatch)
    monkeypatch.setattr(fc_hf, "_is_cuda", lambda t: True)
    monkeypatch.setattr(fc_hf, "_compiled_head_dims", lambda: (64, 128, 256))
    return fc_hf.register()


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
# GPU: the real kernel.


@pytest.fixture(scope="module")
def gpu_name():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to PyTorch")
    try:
        caps = flashcore.capabilities()
    except RuntimeError as exc:
        pytest.skip(f"libflashcore.so not loadable: {exc}")
    if not caps.device_supported or "bfloat16" not in caps.dtypes or 64 not in caps.head_dims:
        pytest.skip(f"the library cannot run bf16 / head_dim 64 here ({caps})")
    return fc_hf.register()


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
