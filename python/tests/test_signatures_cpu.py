"""The public functions' signatures against the ones code is ported from: FlashAttention-3's
(hopper/flash_attn_interface.py, read with `ast`, never imported) and torch's scaled_dot_product_attention.

The rule: a positional argument of a FlashCore function sits at the position, and under the name, that its
FlashAttention-3 counterpart gives it; everything else is keyword-only, so a positional call written for FA2/FA3
(flash_attn_func(q, k, v, 0.125), softmax scale 4th) raises TypeError instead of computing something else. A keyword
that FlashCore shares with FA3 means the same thing; the differences are listed below, each with its reason.

FA3's file: $FLASHCORE_FA3_INTERFACE, else an importable flash_attn_interface (found, not imported), else the FA3
builds beside the checkout (.fa3/ in it, ../shared/fa3/*/); the FA3 comparison skips when none is there. The checks
of FlashCore's own signatures and the argument errors run everywhere (CPU tensors, the kernel emulated)."""

import ast
import importlib.util
import inspect
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from reference import emulate_on_cpu, reference  # noqa: E402
from test_varlen_cpu import _packed, emulate_serving_on_cpu  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]

# FlashCore function -> its FlashAttention-3 counterpart.
COUNTERPARTS = {
    "attention": "flash_attn_func",
    "varlen_attention": "flash_attn_varlen_func",
    "attention_with_kvcache": "flash_attn_with_kvcache",
}

# The arguments FlashCore takes positionally (everything after them is keyword-only).
POSITIONAL = {
    "attention": ("q", "k", "v"),
    "varlen_attention": ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
    "attention_with_kvcache": ("q", "k_cache", "v_cache"),
    "plan_attention": ("q", "k", "v"),
    "sdpa": ("query", "key", "value", "attn_mask", "dropout_p", "is_causal"),
}

# Keywords FlashCore shares with FA3 that were checked to mean the same thing (same values, same effect, same
# default; the default is compared below). A keyword shared with FA3 must be here or in DIFFERENT.
# The attention variants (0.5) are FA3's: window_size (left, right) around the bottom-right aligned diagonal, -1
# unbounded, right bound 0 under causal; softcap (tanh cap of the scaled scores, 0.0 none); attention_chunk (keys of
# the query's chunk only, 0 none). FA3 clamps a window wider than the keys to -1 before its kernels; FlashCore passes
# it on, which sees the same keys.
_VARIANTS = {"window_size", "softcap", "attention_chunk"}
SAME_MEANING = {
    "attention": {"softmax_scale", "causal", "q_descale", "k_descale", "v_descale", "deterministic"} | _VARIANTS,
    "varlen_attention": {"softmax_scale", "causal", "seqused_k"} | _VARIANTS,
    # 0.8: cu_seqlens_q packs q (total_q, H, D) with out (total_q, H, Dv) and lse (H, total_q), as FA3's;
    # cu_seqlens_k_new packs k and v (total_k_new, Hkv, D), each sequence's rows appended at cache_seqlens[b].
    # 0.8: the rotary embedding of an append (FA3's tables, pairs, positions and default rotary_interleaved=True).
    "attention_with_kvcache": {"k", "v", "cache_seqlens", "softmax_scale", "causal", "return_softmax_lse",
                               "cu_seqlens_q", "cu_seqlens_k_new", "rotary_sin", "rotary_interleaved",
                               "rotary_seqlens"} | _VARIANTS,
}

# Keywords FlashCore shares with FA3 whose meaning differs in some respect, and why that is intended.
DIFFERENT = {
    "attention_with_kvcache": {
        "num_splits": "0 (the library's choice) and 1 (no split) as in FA3, but n > 1 is at most n parts (FlashCore "
                      "uses fewer where the key range is too short to give each part work), not exactly n.",
        "page_table": "The same block table (int32 (batch, max_pages)), accepted as an alias of FA2's block_table "
                      "(any page size from 1 to 65536 rows since 0.8, as FA3; a 0.7 library takes multiples of 16 "
                      "only and refuses the others).",
        "cache_batch_idx": "The same slot per sequence (k_cache's batch entry, or page_table's row) for entries in "
                           "range; an entry out of range, which FA3 reads out of bounds with, gives its sequence no "
                           "key (out 0, lse -inf) and no append here.",
        "cache_leftpad": "The same rows [cache_leftpad[b], end) with masks counted from the first, on dense caches; "
                         "with page_table FlashCore raises ValueError (its paged caches take no left padding).",
        "max_seqlen_q": "The same bound on packed queries; FA3 requires it with cu_seqlens_q, FlashCore takes None "
                        "as total_q (always a valid bound).",
        "rotary_cos": "The same rotation of the appended keys and of the queries (the same positions, a multiple of "
                      "16 columns, k and v required); an append of no row with it raises ValueError here (the "
                      "library rotates q only along an append), and positions past the table are clamped to its "
                      "last row.",
        # 0.9: an e4m3 KV cache under 16-bit q.
        "q_descale": "FA3 scales an e4m3 q by it; FlashCore's KV-cache calls keep q in 16 bits, so it raises "
                     "ValueError here (float8 q is flashcore.attention's dense path).",
        "k_descale": "The same float32 (batch, num_heads_kv) factors of an e4m3 k_cache (batch the sequence, real "
                     "value k_cache * k_descale), taken under 16-bit q (FA3 also with e4m3 q, which FlashCore refuses "
                     "here); FlashCore also takes one element (0-d or (1,)) as a factor for the whole cache, and "
                     "raises ValueError with a 16-bit cache.",
        "v_descale": "As k_descale, for v_cache.",
    },
    "varlen_attention": {
        "seqused_q": "The same first seqused_q[b] query rows, causal alignment against them; the other rows are "
                     "0 (out) and -inf (lse) here, uninitialised in FA3, and FlashCore has no backward with it "
                     "(NotImplementedError when the backward runs).",
    },
}

# Concepts FlashCore and FA3 both have under different names (FlashCore name -> FA3 name, reason). FA3's name is
# not accepted: a call that uses it raises TypeError (no **kwargs anywhere), it is never ignored.
RENAMED = {
    "attention": {
        "return_lse": ("return_attn_probs", "FA3's return_attn_probs=True returns (out, lse), as return_lse does, "
                       "but FA2's returns (out, lse, probabilities): the name means different things across "
                       "FlashAttention versions, so FlashCore keeps its own."),
    },
    "varlen_attention": {
        "return_lse": ("return_attn_probs", "As for attention: FA2's flag of that name returns the probabilities "
                       "too."),
    },
    "attention_with_kvcache": {
        "block_table": ("page_table", "FA2's name, kept; FA3's page_table is accepted as an alias (DIFFERENT "
                        "lists how it differs)."),
    },
}

# Arguments FA3 takes positionally that are keyword-only in FlashCore, and why.
KEYWORD_ONLY_HERE = {
    "attention": {
        "softmax_scale": "FA3's 4th positional argument; FlashCore's was causal until 0.3 (the bug this fixes).",
        "causal": "FA3's 5th positional argument; FlashCore's was softmax_scale until 0.3.",
        "q_descale": "After qv in FA3, which FlashCore does not have: positions cannot line up.",
        "k_descale": "As q_descale.",
        "v_descale": "As q_descale.",
        "deterministic": "FA3's 15th positional argument, after num_splits, pack_gqa, ... which FlashCore does not "
                         "have: positions cannot line up.",
        "window_size": "FA3's 10th positional argument, after qv, which FlashCore does not have.",
        "attention_chunk": "As window_size.",
        "softcap": "As window_size.",
    },
    "varlen_attention": {
        "seqused_q": "FA3's 8th positional argument; keyword-only here (added in 0.8, after FlashCore's keyword-only "
                     "arguments; a positional call written for FA3 still fails loudly).",
        "seqused_k": "FA3's 9th positional argument, after seqused_q, which FlashCore took keyword-only (0.8).",
        "softmax_scale": "After seqused_q in FA3: positions cannot line up.",
        "causal": "After seqused_q in FA3: positions cannot line up.",
        "window_size": "After seqused_q and qv in FA3: positions cannot line up.",
        "attention_chunk": "As window_size.",
        "softcap": "As window_size.",
    },
    "attention_with_kvcache": {
        "k": "FA3's 4th positional argument (FA2's too); keyword-only for one rule over the function: after "
             "k_cache/v_cache FA2 and FA3 part ways (6th: FA2 rotary_cos, FA3 qv).",
        "v": "As k.",
        "cache_seqlens": "FA3's 9th positional argument (FA2's 8th, FlashCore's 6th until 0.3).",
        "softmax_scale": "After arguments FlashCore does not have (rotary, descales): positions cannot line up.",
        "causal": "As softmax_scale.",
        "num_splits": "As softmax_scale.",
        "page_table": "As softmax_scale.",
        "return_softmax_lse": "As softmax_scale.",
        "window_size": "As softmax_scale.",
        "attention_chunk": "As softmax_scale.",
        "softcap": "As softmax_scale.",
        "cache_batch_idx": "As softmax_scale.",
        "cache_leftpad": "As softmax_scale.",
        "cu_seqlens_q": "As softmax_scale.",
        "cu_seqlens_k_new": "As softmax_scale.",
        "max_seqlen_q": "As softmax_scale.",
        "rotary_cos": "FA3's 7th positional argument, after qv, which FlashCore does not have.",
        "rotary_sin": "As rotary_cos.",
        "rotary_seqlens": "As softmax_scale.",
        "rotary_interleaved": "As softmax_scale.",
        "q_descale": "After qv and the rotary arguments in FA3 (0.9 here): positions cannot line up.",
        "k_descale": "As q_descale.",
        "v_descale": "As q_descale.",
    },
}


def _fa3_interface():
    """Path of FA3's flash_attn_interface.py, or None."""
    candidates = []
    if os.environ.get("FLASHCORE_FA3_INTERFACE"):
        candidates.append(Path(os.environ["FLASHCORE_FA3_INTERFACE"]))
    try:
        spec = importlib.util.find_spec("flash_attn_interface")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin))
    candidates.append(REPO_ROOT / ".fa3" / "flash_attn_interface.py")
    candidates += [REPO_ROOT.parent / "shared" / "fa3" / build / "flash_attn_interface.py"
                   for build in ("prefill", "serving", "train")]
    return next((path for path in candidates if path.is_file()), None)


@pytest.fixture(scope="module")
def fa3():
    """{function name: [(parameter name, has default, default or None)] in order} of FA3's public functions."""
    path = _fa3_interface()
    if path is None:
        pytest.skip("FlashAttention-3's flash_attn_interface.py not found (set FLASHCORE_FA3_INTERFACE to its path)")
    tree = ast.parse(path.read_text(), filename=str(path))
    functions = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in COUNTERPARTS.values():
            args = node.args
            assert not args.posonlyargs and not args.kwonlyargs and args.vararg is None and args.kwarg is None, (
                f"{path}: {node.name} has positional-only, keyword-only or variadic parameters: update this test")
            defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
            functions[node.name] = [(a.arg, d is not None, None if d is None else ast.literal_eval(d))
                                    for a, d in zip(args.args, defaults)]
    missing = set(COUNTERPARTS.values()) - set(functions)
    assert not missing, f"{path} does not define {sorted(missing)}"
    return functions


def _params(name):
    return inspect.signature(getattr(flashcore, name)).parameters


# ---------------------------------------------------------------------------------------------------------------
# FlashCore's own signatures (no FA3 needed).


@pytest.mark.parametrize("name", sorted(POSITIONAL))
def test_only_the_listed_arguments_are_positional(name):
    params = _params(name)
    kinds = {p.kind for p in params.values()}
    assert inspect.Parameter.VAR_POSITIONAL not in kinds and inspect.Parameter.VAR_KEYWORD not in kinds, (
        f"flashcore.{name} takes *args/**kwargs: an argument written for another library could vanish into them")
    positional = tuple(n for n, p in params.items() if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD))
    assert positional == POSITIONAL[name]
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in params if n not in positional)


# Keyword-only arguments flashcore.sdpa takes after all of torch's (torch's function has none of them), and why.
SDPA_EXTRAS = {
    "deterministic": (False, "Bit-identical gradients from run to run (the backward's fixed-order dq sums), "
                             "FlashAttention's name; torch has a process-wide switch instead "
                             "(torch.use_deterministic_algorithms)."),
    "window_size": ((-1, -1), "Sliding-window attention with FlashAttention's (left, right) (torch's SDPA needs a "
                              "materialised mask for it, which is what the window saves)."),
    "softcap": (0.0, "FlashAttention's tanh softcap of the scores (Gemma 2); SDPA has none."),
    "sinks": (None, "Per-head attention-sink logits (gpt-oss, FlashAttention-4's learnable_sink); SDPA has none."),
}


def test_sdpa_takes_torchs_positional_order():
    """flashcore.sdpa is the drop-in for F.scaled_dot_product_attention: the same names in the same order, the same
    defaults, and torch's split between positional and keyword-only arguments (probed by calling torch's function:
    its signature is not introspectable). After them only FlashCore's own keyword-only extras (SDPA_EXTRAS), each
    with a default, so a call written for torch means the same here."""
    torch_sdpa = torch.nn.functional.scaled_dot_product_attention
    header = torch_sdpa.__doc__.strip().split("->")[0]
    torch_args = ast.parse(f"def {header}: pass").body[0].args
    names = [a.arg for a in torch_args.args + torch_args.kwonlyargs]
    defaults = [ast.literal_eval(d) for d in torch_args.defaults + [d for d in torch_args.kw_defaults if d]]
    params = _params("sdpa")
    assert list(params) == names + list(SDPA_EXTRAS)
    assert not set(SDPA_EXTRAS) & set(names)
    for name, (default, reason) in SDPA_EXTRAS.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default == default and reason
    assert [p.default for n, p in params.items() if n in names and p.default is not inspect.Parameter.empty] == \
        defaults

    q = torch.randn(1, 2, 4, 8)
    values = [q, q, q, None, 0.0, False, None, False]
    torch_positional = 3
    for n in range(4, len(values) + 1):
        try:
            torch_sdpa(*values[:n])
        except TypeError:
            break
        torch_positional = n
    assert POSITIONAL["sdpa"] == tuple(names[:torch_positional])


# ---------------------------------------------------------------------------------------------------------------
# Against FlashAttention-3.


@pytest.mark.parametrize("name", sorted(COUNTERPARTS))
def test_positional_arguments_match_fa3(fa3, name):
    ours = tuple(n for n, p in _params(name).items() if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                                   inspect.Parameter.POSITIONAL_OR_KEYWORD))
    theirs = [p[0] for p in fa3[COUNTERPARTS[name]]]
    assert list(ours) == theirs[:len(ours)], (
        f"flashcore.{name}'s positional arguments {ours} are not FA3's {COUNTERPARTS[name]} first {len(ours)}: "
        f"{theirs[:len(ours)]}")


@pytest.mark.parametrize("name", sorted(COUNTERPARTS))
def test_shared_keywords_are_reviewed(fa3, name):
    """Every keyword FlashCore shares with FA3 is either listed as meaning the same thing (and has FA3's default)
    or listed as an intended difference, with the reason; the tables name only parameters both sides have."""
    ours = _params(name)
    theirs = {p[0]: p for p in fa3[COUNTERPARTS[name]]}
    shared = (set(ours) & set(theirs)) - set(POSITIONAL[name])
    same, different = SAME_MEANING.get(name, set()), DIFFERENT.get(name, {})
    assert not same & set(different), "a keyword cannot be both the same and different"
    assert shared == same | set(different), (
        f"flashcore.{name} shares {sorted(shared)} with FA3's {COUNTERPARTS[name]}; reviewed: "
        f"{sorted(same | set(different))}. List a new shared keyword in SAME_MEANING or DIFFERENT.")
    for keyword in same:
        _, has_default, default = theirs[keyword]
        assert has_default and ours[keyword].default == default, (
            f"flashcore.{name}({keyword}=) defaults to {ours[keyword].default!r}, FA3 to {default!r}")
    for keyword in shared:
        if keyword in KEYWORD_ONLY_HERE.get(name, {}):
            continue
        position = list(theirs).index(keyword)
        assert position < len(POSITIONAL[name]), (
            f"{keyword} is positional in FA3 (position {position}) and keyword-only in flashcore.{name}: say why in "
            f"KEYWORD_ONLY_HERE")
    for keyword in KEYWORD_ONLY_HERE.get(name, {}):
        assert keyword in shared, f"KEYWORD_ONLY_HERE[{name!r}] names {keyword}, which FA3 and FlashCore do not share"
    for ours_name, (fa3_name, reason) in RENAMED.get(name, {}).items():
        assert ours_name in ours and fa3_name in theirs and reason
        assert ours_name not in theirs, f"{ours_name} is one of FA3's own names: not a rename"


# ---------------------------------------------------------------------------------------------------------------
# The calls themselves: CPU tensors, the kernel emulated.


def _qkv(b=2, sq=16, sk=16, hq=4, hkv=2, d=64, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(b, sq, hq, d, generator=gen).to(dtype), torch.randn(b, sk, hkv, d, generator=gen).to(dtype),
            torch.randn(b, sk, hkv, d, generator=gen).to(dtype))


@pytest.fixture
def emulated(monkeypatch):
    emulate_on_cpu(monkeypatch)
    emulate_serving_on_cpu(monkeypatch)


def test_fa3_positional_softmax_scale_raises(emulated):
    """flash_attn_func(q, k, v, 0.125) ported as is: the scale used to land in causal (bool(0.125) is True), and the
    call ran causal attention with the default scale, silently."""
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="positional"):
        flashcore.attention(q, k, v, 0.125)
    with pytest.raises(TypeError, match="positional"):
        flashcore.attention(q, k, v, 0.125, False)
    out = flashcore.attention(q, k, v, softmax_scale=0.125)
    want, _ = reference(q, k, v, False, 0.125)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=0)


@pytest.mark.parametrize("causal", [0.125, 1.0, None, "True", torch.tensor(True)],
                         ids=["scale", "float-one", "none", "str", "tensor"])
def test_causal_must_be_a_bool(emulated, causal):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="causal must be a bool"):
        flashcore.attention(q, k, v, causal=causal)
    with pytest.raises(TypeError, match="causal must be a bool"):
        flashcore.plan_attention(q, k, v, causal=causal)
    with pytest.raises(TypeError, match="causal must be a bool"):
        flashcore.attention_with_kvcache(q, k, v, causal=causal)
    qp, kp, vp, cq, ck = _packed([3, 5], [4, 6])
    with pytest.raises(TypeError, match="causal must be a bool"):
        flashcore.varlen_attention(qp, kp, vp, cq, ck, 5, 6, causal=causal)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        flashcore.sdpa(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal)


def test_zero_one_ints_are_bools(emulated):
    q, k, v = _qkv(sq=5, sk=9)
    for flag in (0, 1):
        torch.testing.assert_close(flashcore.attention(q, k, v, causal=flag),
                                   flashcore.attention(q, k, v, causal=bool(flag)), atol=0, rtol=0)
    out, lse = flashcore.attention(q, k, v, causal=1, return_lse=1)
    assert lse.shape == (2, 4, 5)
    with pytest.raises(ValueError, match="causal must be a bool"):
        flashcore.attention(q, k, v, causal=2)


@pytest.mark.parametrize("flag", ["return_lse", "v_transposed"])
def test_other_flags_must_be_bools(emulated, flag):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=f"{flag} must be a bool"):
        flashcore.attention(q, k, v, **{flag: 0.5})


@pytest.mark.parametrize("scale", ["0.125", torch.tensor(0.125), True, [0.125]], ids=["str", "tensor", "bool", "list"])
def test_softmax_scale_must_be_a_number(emulated, scale):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="softmax_scale must be a float or None"):
        flashcore.attention(q, k, v, softmax_scale=scale)
    with pytest.raises(TypeError, match="softmax_scale must be a float or None"):
        flashcore.attention_with_kvcache(q, k, v, softmax_scale=scale)
    with pytest.raises(TypeError, match="^FlashCore: scale must be a float or None"):
        flashcore.sdpa(*(t.transpose(1, 2) for t in (q, k, v)), scale=scale)


def test_kvcache_sixth_positional_raises(emulated):
    """FA3's sixth positional argument of flash_attn_with_kvcache is qv (FA2's rotary_cos); FlashCore's was
    cache_seqlens."""
    q, k, v = _qkv(sq=1)
    lengths = torch.tensor([3, 9], dtype=torch.int32)
    with pytest.raises(TypeError, match="positional"):
        flashcore.attention_with_kvcache(q, k, v, None, None, lengths)
    with pytest.raises(TypeError, match="positional"):
        flashcore.attention_with_kvcache(q, k, v, k[:, :1], v[:, :1])
    out = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lengths, causal=True)
    assert out.shape == q.shape


def test_sdpa_scale_is_keyword_only(emulated):
    q, k, v = (t.transpose(1, 2) for t in _qkv())
    with pytest.raises(TypeError, match="positional"):
        flashcore.sdpa(q, k, v, None, 0.0, False, 0.125)
    out = flashcore.sdpa(q, k, v, None, 0.0, True, scale=0.125)
    want = flashcore.attention(*(t.transpose(1, 2) for t in (q, k, v)), causal=True, softmax_scale=0.125)
    torch.testing.assert_close(out, want.transpose(1, 2), atol=0, rtol=0)


def test_plan_attention_is_keyword_only():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="positional"):
        flashcore.plan_attention(q, k, v, True)  # fails binding its arguments: no library needed
