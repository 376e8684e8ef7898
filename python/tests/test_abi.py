"""The ctypes mirror of the C ABI against include/flashcore/flashcore.h (no torch, no GPU needed)."""

import ctypes
import os
import re
import subprocess
import sys

import pytest

from conftest import PYTHON_DIR, REPO_ROOT
from flashcore import _lib

STRUCTS = {
    "flashcore_tensor_strides": _lib.TensorStridesStruct,
    "flashcore_attention_params": _lib.AttentionParamsStruct,
    "flashcore_capabilities": _lib.CapabilitiesStruct,
    "flashcore_lse_strides": _lib.LseStridesStruct,
    "flashcore_merge_params": _lib.MergeParamsStruct,
    "flashcore_ring_params": _lib.RingParamsStruct,  # include/flashcore/ring.h
}
RING_HEADER = REPO_ROOT / "include" / "flashcore" / "ring.h"

C_TYPES = {
    "char": ctypes.c_char,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
    "flashcore_dtype": ctypes.c_int,  # a C enum
    "flashcore_tensor_strides": _lib.TensorStridesStruct,
    "flashcore_lse_strides": _lib.LseStridesStruct,
    "flashcore_ring_layout": ctypes.c_int,  # a C enum
}


def _strip_comments(text):
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def parse_struct(header, name):
    """[(field name, C type, is_pointer, array lengths or None)] of `typedef struct name {...} name;` (the lengths of
    each array dimension, outermost first, as written: a macro name or a number)."""
    match = re.search(r"typedef\s+struct\s+%s\s*\{(.*?)\}\s*%s\s*;" % (name, name), _strip_comments(header), re.S)
    assert match, f"struct {name} not found in the header"
    fields = []
    for decl in match.group(1).split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        m = re.fullmatch(r"(?:const )?(\w+)\s*(\*?)\s*(\w+)((?:\[\w+\])*)", decl)
        assert m, f"cannot parse declaration {decl!r} in {name}"
        ctype, pointer, field, lengths = m.groups()
        fields.append((field, ctype, bool(pointer), re.findall(r"\[(\w+)\]", lengths) or None))
    return fields


def parse_enum(header, name):
    match = re.search(r"typedef\s+enum\s+%s\s*\{(.*?)\}\s*%s\s*;" % (name, name), _strip_comments(header), re.S)
    assert match, f"enum {name} not found in the header"
    return {k: int(v) for k, v in re.findall(r"(\w+)\s*=\s*(-?\d+)", match.group(1))}


def parse_define(header, name):
    return int(re.search(r"#define\s+%s\s+(\d+)" % name, header).group(1))


@pytest.mark.parametrize("struct_name", sorted(STRUCTS))
def test_struct_fields_match_header(header_text, struct_name):
    struct = STRUCTS[struct_name]
    text = RING_HEADER.read_text() if struct_name == "flashcore_ring_params" else header_text
    parsed = parse_struct(text, struct_name)
    assert [f[0] for f in parsed] == [f[0] for f in struct._fields_], "field names/order differ from the header"
    for (field, ctype, pointer, lengths), (_, py_type) in zip(parsed, struct._fields_):
        if pointer:
            expected = ctypes.c_void_p
        else:
            expected = C_TYPES[ctype]
        if lengths is not None:
            for length in lengths:  # int32_t x[A][B]: an array of A arrays of B
                assert issubclass(py_type, ctypes.Array), field
                assert py_type._length_ == (int(length) if length.isdigit() else parse_define(header_text, length)), \
                    field
                py_type = py_type._type_
            assert py_type is expected, field
        else:
            assert py_type is expected, f"{struct_name}.{field}: {py_type} vs C {ctype}{'*' if pointer else ''}"


def test_enums_match_header(header_text):
    statuses = parse_enum(header_text, "flashcore_status")
    assert statuses == {name: code for code, name in _lib.STATUS_NAMES.items()}
    for name, code in statuses.items():
        assert getattr(_lib, name.replace("FLASHCORE_", "")) == code
    dtypes = parse_enum(header_text, "flashcore_dtype")
    assert {getattr(_lib, n.replace("FLASHCORE_", "")): v for n, v in dtypes.items()} == {v: v for v in dtypes.values()}
    assert dtypes["FLASHCORE_DTYPE_SAME"] == _lib.DTYPE_SAME == -1
    assert set(_lib.DTYPE_NAMES) == set(dtypes.values()) - {_lib.DTYPE_SAME}
    assert _lib.MAX_CAPS == parse_define(header_text, "FLASHCORE_MAX_CAPS")
    assert _lib.ATTENTION_PARAMS_V1_SIZE == parse_define(header_text, "FLASHCORE_ATTENTION_PARAMS_V1_SIZE")
    assert _lib.ATTENTION_PARAMS_V2_SIZE == parse_define(header_text, "FLASHCORE_ATTENTION_PARAMS_V2_SIZE")
    assert _lib.ATTENTION_PARAMS_V3_SIZE == parse_define(header_text, "FLASHCORE_ATTENTION_PARAMS_V3_SIZE")
    assert _lib.ATTENTION_PARAMS_V4_SIZE == parse_define(header_text, "FLASHCORE_ATTENTION_PARAMS_V4_SIZE")
    assert _lib.ATTENTION_PARAMS_V5_SIZE == parse_define(header_text, "FLASHCORE_ATTENTION_PARAMS_V5_SIZE")
    assert _lib.ATTENTION_PARAMS_V6_SIZE == parse_define(header_text, "FLASHCORE_ATTENTION_PARAMS_V6_SIZE")
    assert _lib.ATTENTION_PARAMS_V7_SIZE == parse_define(header_text, "FLASHCORE_ATTENTION_PARAMS_V7_SIZE")
    assert _lib.PRECISION_NATIVE == parse_define(header_text, "FLASHCORE_PRECISION_NATIVE") == 0
    assert _lib.PRECISION_FP8 == parse_define(header_text, "FLASHCORE_PRECISION_FP8") == 1
    assert _lib.PRECISION_INT8 == parse_define(header_text, "FLASHCORE_PRECISION_INT8") == 2
    assert _lib.FLAG_V_TRANSPOSED == int(re.search(r"#define\s+FLASHCORE_FLAG_V_TRANSPOSED\s+(\d+)u",
                                                   header_text).group(1)) == 1
    assert _lib.DTYPE_NAMES[_lib.DTYPE_FP8_E4M3] == "float8_e4m3fn" and _lib.DTYPE_FP8_E4M3 == 3
    assert _lib.CAPABILITIES_V1_SIZE == parse_define(header_text, "FLASHCORE_CAPABILITIES_V1_SIZE")
    ring = RING_HEADER.read_text()
    assert parse_enum(ring, "flashcore_ring_layout") == {"FLASHCORE_RING_ZIGZAG": _lib.RING_ZIGZAG,
                                                         "FLASHCORE_RING_CONTIGUOUS": _lib.RING_CONTIGUOUS}
    assert int(re.search(r"#define\s+FLASHCORE_RING_SERIALIZE\s+(\d+)u", ring).group(1)) == _lib.RING_SERIALIZE


def test_version_has_one_source(header_text):
    """The header's FLASHCORE_VERSION_* macros; python carries it once (_lib.__version__), everything else reads it."""
    import flashcore

    version = tuple(parse_define(header_text, f"FLASHCORE_VERSION_{p}") for p in ("MAJOR", "MINOR", "PATCH"))
    assert _lib.ABI_VERSION == version
    assert _lib.__version__ == ".".join(map(str, version))
    assert flashcore.__version__ == _lib.__version__
    pyproject = (PYTHON_DIR / "pyproject.toml").read_text()
    assert not re.search(r"^version\s*=\s*\"", pyproject, re.M), "pyproject.toml must not hard-code the version"
    assert 'attr = "flashcore._lib.__version__"' in pyproject


def test_v1_prefix_of_the_mirror():
    """A 0.1 library is handed the mirror's first 240 bytes: the 0.1 fields must end there."""
    assert _lib.AttentionParamsStruct.out_dtype.offset == 236
    assert _lib.CapabilitiesStruct.params_struct_size.offset == _lib.CAPABILITIES_V1_SIZE


def test_v2_prefix_of_the_mirror():
    """A 0.2 library is handed the mirror's first 448 bytes: the 0.2 fields end there, the 0.3 ones follow."""
    params = _lib.AttentionParamsStruct
    assert params.seqlen_new.offset + params.seqlen_new.size == _lib.ATTENTION_PARAMS_V2_SIZE
    assert params.q_descale.offset == _lib.ATTENTION_PARAMS_V2_SIZE
    names = [name for name, _ in params._fields_]
    assert names[names.index("q_descale"):names.index("dout")] == ["q_descale", "k_descale", "v_descale",
                                                                   "precision", "reserved2"]


def test_v3_prefix_of_the_mirror():
    """A 0.3 library is handed the mirror's first 480 bytes: the 0.3 fields end there, the backward's (0.4) follow."""
    params = _lib.AttentionParamsStruct
    assert params.reserved2.offset + params.reserved2.size == _lib.ATTENTION_PARAMS_V3_SIZE == params.dout.offset
    names = [name for name, _ in params._fields_]
    assert names[names.index("dout"):names.index("local")] == ["dout", "dq", "dk", "dv", "dout_strides", "dq_strides",
                                                                "dk_strides", "dv_strides", "deterministic",
                                                                "reserved3"]


def test_v4_prefix_of_the_mirror():
    """A 0.4 library is handed the mirror's first 648 bytes: the 0.4 fields end there, the variants (0.5) follow."""
    params = _lib.AttentionParamsStruct
    assert params.reserved3.offset + params.reserved3.size == _lib.ATTENTION_PARAMS_V4_SIZE == params.local.offset
    names = [name for name, _ in params._fields_]
    assert names[names.index("local"):names.index("dsinks")] == ["local", "window_size_left", "window_size_right",
                                                                 "softcap", "sinks", "attention_chunk", "reserved4"]
    assert params.sinks.offset % 8 == 0  # the pointer after four 4-byte fields: no padding before it


def test_v5_prefix_of_the_mirror():
    """A 0.5 library is handed the mirror's first 680 bytes: the 0.5 fields end there, dsinks (0.6) follows."""
    params = _lib.AttentionParamsStruct
    assert params.reserved4.offset + params.reserved4.size == _lib.ATTENTION_PARAMS_V5_SIZE == params.dsinks.offset
    assert params.dsinks.offset % 8 == 0 and params.dsinks.size == 8


def test_v6_prefix_of_the_mirror():
    """A 0.6 library is handed the mirror's first 688 bytes: the 0.6 fields end there (dsinks last), head_dim_v (0.7)
    follows."""
    params = _lib.AttentionParamsStruct
    assert params.dsinks.offset + params.dsinks.size == _lib.ATTENTION_PARAMS_V6_SIZE == 688
    assert params.head_dim_v.offset == 688 and params.head_dim_v.size == 8
    names = [name for name, _ in params._fields_]
    assert names[names.index("dsinks"):names.index("dsinks") + 2] == ["dsinks", "head_dim_v"]


def test_v7_prefix_of_the_mirror():
    """A 0.7 library is handed the mirror's first 696 bytes: the 0.7 fields end there (head_dim_v last), the serving
    fields of 0.8 follow and end the struct (784 bytes): kv_batch_idx .. total_k_new, seqused_q, then the rotary
    fields (two pointers, an int64, two int32, a pointer)."""
    params = _lib.AttentionParamsStruct
    assert params.head_dim_v.offset + params.head_dim_v.size == _lib.ATTENTION_PARAMS_V7_SIZE == 696
    names = [name for name, _ in params._fields_]
    assert names[names.index("head_dim_v"):] == ["head_dim_v", "kv_batch_idx", "kv_batch_size", "leftpad_k",
                                                 "cu_seqlens_k_new", "total_k_new", "seqused_q", "rotary_cos",
                                                 "rotary_sin", "rotary_seqlen", "rotary_dim", "rotary_interleaved",
                                                 "rotary_seqlens"]
    assert [getattr(params, n).offset for n in names[-12:]] == [696, 704, 712, 720, 728, 736, 744, 752, 760, 768, 772,
                                                                776]
    assert [getattr(params, n).size for n in names[-7:]] == [8, 8, 8, 8, 4, 4, 8]
    assert ctypes.sizeof(params) == 784


def test_capabilities_v2_prefix_of_the_mirror():
    """A 0.2 to 0.6 library fills (and accepts at most) the first 304 bytes of flashcore_capabilities: device_backend
    ends there, the head dim pairs (0.7) follow."""
    caps = _lib.CapabilitiesStruct
    assert caps.device_backend.offset + caps.device_backend.size == _lib.CAPABILITIES_V2_SIZE == 304
    assert caps.num_head_dim_pairs.offset == _lib.CAPABILITIES_V2_SIZE
    assert caps.head_dim_pairs.offset == 308 and caps.head_dim_pairs.size == _lib.MAX_CAPS * 2 * 4
    assert ctypes.sizeof(caps) == 436


def test_every_status_maps_to_an_exception():
    for code in _lib.STATUS_NAMES:
        if code == _lib.SUCCESS:
            continue
        exc = _lib.exception_for_status(code, "boom")
        assert "boom" in str(exc) and _lib.STATUS_NAMES[code] in str(exc)
        if code == _lib.ERROR_UNSUPPORTED_DTYPE:
            assert type(exc) is TypeError
        elif code in (_lib.ERROR_NO_DEVICE, _lib.ERROR_UNSUPPORTED_ARCH, _lib.ERROR_CUDA, _lib.ERROR_INTERNAL,
                      _lib.ERROR_NCCL):
            assert type(exc) is RuntimeError
        else:
            assert type(exc) is ValueError
    assert type(_lib.exception_for_status(99, "x")) is RuntimeError


def test_layout_matches_c_compiler(header_text, c_compiler, tmp_path):
    """sizeof / offsetof of every field, from C, equal ctypes' sizes and offsets."""
    lines = []
    for struct_name, struct in STRUCTS.items():
        lines.append(f'printf("{struct_name} sizeof %zu\\n", sizeof({struct_name}));')
        for field, _ in struct._fields_:
            lines.append(f'printf("{struct_name} {field} %zu\\n", offsetof({struct_name}, {field}));')
    source = tmp_path / "layout.c"
    source.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"flashcore/flashcore.h\"\n#include \"flashcore/ring.h\"\n"
        "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n"
    )
    exe = tmp_path / "layout"
    subprocess.run([c_compiler, f"-I{REPO_ROOT / 'include'}", str(source), "-o", str(exe)], check=True)
    output = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    from_c = {tuple(line.split()[:2]): int(line.split()[2]) for line in output if line}
    for struct_name, struct in STRUCTS.items():
        assert from_c[(struct_name, "sizeof")] == ctypes.sizeof(struct), struct_name
        for field, _ in struct._fields_:
            assert from_c[(struct_name, field)] == getattr(struct, field).offset, f"{struct_name}.{field}"


# ---------------------------------------------------------------------------------------------------------------
# Import and lookup (no library needed).


def test_import_needs_neither_torch_nor_library(tmp_path):
    code = (
        "import sys; import flashcore; import flashcore._lib; import flashcore.integrations; "
        "assert 'torch' not in sys.modules, 'importing flashcore imported torch'; "
        "print(flashcore.__version__)"
    )
    env = {"PYTHONPATH": str(PYTHON_DIR), "FLASHCORE_LIBRARY": str(tmp_path / "missing.so"), "PATH": ""}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == _lib.__version__


def test_missing_library_error_names_where_it_looked(use_library, tmp_path):
    missing = tmp_path / "nowhere" / "libflashcore.so"
    use_library(missing)
    assert not _lib.is_available()
    with pytest.raises(RuntimeError) as info:
        _lib.load()
    assert str(missing) in str(info.value) and "FLASHCORE_LIBRARY" in str(info.value)


def test_explicit_library_is_the_only_candidate(monkeypatch):
    monkeypatch.setenv(_lib.LIBRARY_ENV, "relative/libflashcore.so")
    expected = os.path.join(os.getcwd(), "relative", "libflashcore.so")
    assert _lib.candidates() == [("$FLASHCORE_LIBRARY", expected)]


def test_default_lookup_order(monkeypatch):
    monkeypatch.delenv(_lib.LIBRARY_ENV, raising=False)
    found = _lib.candidates()
    assert [d for d, _ in found] == ["package copy", "repository build", "dynamic loader search"]
    assert found[0][1] == str(PYTHON_DIR / "flashcore" / "lib" / "libflashcore.so")
    assert found[1][1] == str(REPO_ROOT / "build" / "lib" / "libflashcore.so")


def test_load_failure_lists_every_candidate(monkeypatch, tmp_path):
    monkeypatch.delenv(_lib.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(_lib, "_package_dir", lambda: tmp_path / "pkg" / "flashcore")
    monkeypatch.setattr(_lib.ctypes.util, "find_library", lambda name: None)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    _lib.reset()
    try:
        with pytest.raises(RuntimeError) as info:
            _lib.load()
    finally:
        _lib.reset()
    message = str(info.value)
    assert str(tmp_path / "pkg" / "flashcore" / "lib" / "libflashcore.so") in message
    assert "dynamic loader search" in message


# ---------------------------------------------------------------------------------------------------------------
# Through a host-only stub library built from tests/stub/flashcore_stub.c.


def test_stub_loads_and_reports(use_library, stub_library):
    use_library(stub_library)
    import flashcore

    assert flashcore.is_available()
    assert flashcore.library_path() == stub_library
    assert flashcore.library_version() == _lib.__version__ + "-stub"
    caps = flashcore.capabilities()
    params_size = ctypes.sizeof(_lib.AttentionParamsStruct)
    assert caps == _lib.Capabilities(
        ("float16", "bfloat16", "float8_e4m3fn"), (64, 128, 256), (90,), 0, False, ("float16", "bfloat16"), "",
        params_size, ((192, 128),)
    )
    assert _lib.load().params_struct_size == params_size
    assert _lib.load().kernel_configs(_lib.DTYPE_BF16, 64, True) == ("default",)
    assert _lib.load().kernel_configs(_lib.DTYPE_FP8_E4M3, 64, False) == ()  # the stub's 8-bit head dims: 128, 256
    assert _lib.load().kernel_configs(_lib.DTYPE_FP8_E4M3, 128, True) == ("default",)
    assert _lib.load().compiled() == (("float16", "bfloat16", "float8_e4m3fn"), (64, 128, 256))
    assert _lib.load().compiled_head_dim_pairs() == ((192, 128),)
    assert all(_lib.load().has_params_field(name) for name in ("out_dtype", "seqlen_new", "precision", "reserved2",
                                                               "dout", "reserved3", "local", "sinks", "reserved4",
                                                               "dsinks", "head_dim_v", "kv_batch_idx",
                                                               "total_k_new", "seqused_q", "rotary_cos",
                                                               "rotary_seqlens"))
    assert _lib.load().has_backward() and _lib.load().has_variants() and _lib.load().has_variant_backward()
    assert _lib.load().has_head_dim_v() and _lib.load().has_kvcache_serving()


def test_params_reach_c_intact(use_library, stub_library):
    use_library(stub_library)
    lib = _lib.load()
    params = _lib.fill_params(
        lib.new_params(),
        pointers=(0x1000, 0x2000, 0x3000, 0x4000, 0),
        strides=((8192, 512, 64, 1), (4096, 64, 1024, 1), (1 << 40, 128, 16, 1), (24, 32, 40, 1)),
        sizes=(2, 3, 5, 7, 1, 64),
        dtype=_lib.DTYPE_BF16,
        causal=True,
        softmax_scale=0.125,
    )
    lib.forward(params, 0xABC0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    lib._cdll.stub_last_stream.restype = ctypes.c_void_p
    assert lib._cdll.stub_last_stream() == 0xABC0
    assert ctypes.string_at(ctypes.addressof(seen), ctypes.sizeof(seen)) == ctypes.string_at(
        ctypes.addressof(params), ctypes.sizeof(params)
    )
    assert (seen.q, seen.k, seen.v, seen.o, seen.lse) == (0x1000, 0x2000, 0x3000, 0x4000, None)
    assert (seen.v_strides.batch, seen.o_strides.head, seen.k_strides.head) == (1 << 40, 40, 1024)
    assert (seen.batch, seen.seqlen_q, seen.seqlen_k, seen.num_heads_q, seen.num_heads_kv, seen.head_dim) == (
        2, 3, 5, 7, 1, 64)
    assert (seen.dtype, seen.causal, seen.softmax_scale) == (_lib.DTYPE_BF16, 1, 0.125)
    assert seen.struct_size == ctypes.sizeof(_lib.AttentionParamsStruct)
    assert (seen.out_dtype, seen.lse_capacity, seen.workspace, seen.kernel_config) == (_lib.DTYPE_SAME, 0, None, None)
    assert (seen.q_descale, seen.k_descale, seen.v_descale, seen.precision, seen.reserved2) == (
        None, None, None, _lib.PRECISION_NATIVE, 0)
    assert (seen.dout, seen.dq, seen.dk, seen.dv, seen.deterministic, seen.reserved3) == (None,) * 4 + (0, 0)
    assert all(getattr(seen, f).dim == 1 for f in ("dout_strides", "dq_strides", "dk_strides", "dv_strides"))
    assert (seen.local, seen.window_size_left, seen.window_size_right, seen.softcap, seen.sinks, seen.attention_chunk,
            seen.reserved4, seen.dsinks) == (0, 0, 0, 0.0, None, 0, 0, None)
    assert seen.head_dim_v == 0  # V of q's head dim: the default
    assert (seen.kv_batch_idx, seen.kv_batch_size, seen.leftpad_k, seen.cu_seqlens_k_new, seen.total_k_new) == (
        None, 0, None, None, 0)  # the 0.8 serving fields' defaults
    assert (seen.seqused_q, seen.rotary_cos, seen.rotary_sin, seen.rotary_seqlen, seen.rotary_dim,
            seen.rotary_interleaved, seen.rotary_seqlens) == (None, None, None, 0, 0, 0, None)
    assert lib.workspace_size(params) == 0


def _mla_params(lib):
    """The params of a (head_dim, head_dim_v) = (192, 128) call: q, k (.., 192), v, o (.., 128)."""
    params = _lib.fill_params(lib.new_params(), pointers=(0x1000, 0x2000, 0x3000, 0x4000, 0),
                              strides=((3 * 8 * 192, 8 * 192, 192, 1), (3 * 2 * 192, 2 * 192, 192, 1),
                                       (3 * 2 * 128, 2 * 128, 128, 1), (3 * 8 * 128, 8 * 128, 128, 1)),
                              sizes=(2, 3, 3, 8, 2, 192), dtype=_lib.DTYPE_BF16, causal=True, softmax_scale=0.0)
    return lib.set_head_dim_v(params, 128)


def test_head_dim_v_reaches_c_intact(use_library, stub_library):
    """A 0.7 library: set_head_dim_v writes the field (at offset 688) for a V of its own head dim, and leaves it 0
    (head_dim) for one of q's."""
    use_library(stub_library)
    lib = _lib.load()
    params = _mla_params(lib)
    assert params.head_dim_v == 128
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert (seen.head_dim, seen.head_dim_v, seen.v_strides.head, seen.o_strides.seq) == (192, 128, 128, 8 * 128)
    assert ctypes.string_at(ctypes.addressof(seen) + 688, 8) == (128).to_bytes(8, "little")
    same = lib.set_head_dim_v(_variant_params(lib), 64)  # head_dim 64: nothing to set
    assert same.head_dim_v == 0


def _variant_params(lib, causal=False):
    return _lib.fill_params(lib.new_params(), pointers=(0x1000, 0x2000, 0x3000, 0x4000, 0),
                            strides=((8192, 512, 64, 1),) * 4, sizes=(2, 3, 5, 8, 2, 64), dtype=_lib.DTYPE_BF16,
                            causal=causal, softmax_scale=0.0)


def test_variant_params_reach_c_intact(use_library, stub_library):
    use_library(stub_library)
    lib = _lib.load()
    params = lib.set_variants(_variant_params(lib), causal=False, window_size=(7, 3), softcap=30.0, sinks=0x5000,
                              attention_chunk=1024)
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert (seen.local, seen.window_size_left, seen.window_size_right, seen.softcap, seen.sinks,
            seen.attention_chunk, seen.reserved4) == (1, 7, 3, 30.0, 0x5000, 1024, 0)
    assert ctypes.string_at(ctypes.addressof(seen), ctypes.sizeof(seen)) == ctypes.string_at(
        ctypes.addressof(params), ctypes.sizeof(params))


@pytest.mark.parametrize(
    "causal, window, local, left, right",
    [
        (False, (-1, -1), 0, 0, 0),  # no window: the fields stay at their defaults
        (True, (-1, -1), 0, 0, 0),
        (True, (-1, 5), 0, 0, 0),  # causal fixes the right bound at 0: (-1, anything) is plain causal
        (True, (4, -1), 1, 4, -1),  # causal window: the right bound is not read, passed as given
        (False, (-1, 0), 1, -1, 0),  # a right bound alone is a window without causal
        (False, (0, 0), 1, 0, 0),  # each query sees its own key only
    ],
)
def test_window_size_to_local(use_library, stub_library, causal, window, local, left, right):
    use_library(stub_library)
    lib = _lib.load()
    params = lib.set_variants(_variant_params(lib, causal), causal=causal, window_size=window)
    assert (params.local, params.window_size_left, params.window_size_right, params.causal) == (
        local, left, right, int(causal))


@pytest.fixture
def stub_v4_library(c_compiler, header_text, tmp_path_factory):
    """The stub playing a 0.4 library (struct_size 648: the backward, no attention variants)."""
    from conftest import build_stub

    return build_stub(c_compiler, tmp_path_factory.mktemp("stub_v4"), "libflashcore_v4.so",
                      "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V4_SIZE")


def test_v4_library_gets_the_v4_struct_size(use_library, stub_v4_library):
    """A 0.4 library is passed struct_size 648 and runs plain (and backward) calls; a variant it cannot read is
    refused with RuntimeError naming it, before any call, instead of being dropped."""
    use_library(stub_v4_library)
    lib = _lib.load()
    assert lib.params_struct_size == _lib.ATTENTION_PARAMS_V4_SIZE
    assert lib.has_backward() and lib.has_params_field("reserved3")
    assert not lib.has_variants() and not lib.has_params_field("local")
    params = _variant_params(lib, causal=True)
    assert params.struct_size == _lib.ATTENTION_PARAMS_V4_SIZE
    # What a 0.4 library can run: no variant, or a causal "window" that is plain causal attention.
    lib.set_variants(params, causal=True)
    lib.set_variants(params, causal=True, window_size=(-1, 3))
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert seen.struct_size == _lib.ATTENTION_PARAMS_V4_SIZE and seen.local == 0
    for kwargs, name in ((dict(window_size=(4, 0)), "window_size"), (dict(softcap=50.0), "softcap"),
                         (dict(sinks=0x5000), "sinks"), (dict(attention_chunk=64), "attention_chunk")):
        with pytest.raises(RuntimeError, match=f"{name} is set, but .*a 0.5 library or newer is needed"):
            lib.set_variants(params, causal=True, **kwargs)
    assert bytes(ctypes.string_at(ctypes.addressof(params) + _lib.ATTENTION_PARAMS_V4_SIZE,
                                  ctypes.sizeof(params) - _lib.ATTENTION_PARAMS_V4_SIZE)) == bytes(
        ctypes.sizeof(params) - _lib.ATTENTION_PARAMS_V4_SIZE)
    assert not lib.has_variant_backward()
    with pytest.raises(RuntimeError, match="dsinks .*a 0.6 library or newer is needed"):
        lib.set_dsinks(params, 0x6000)


@pytest.fixture
def stub_v5_library(c_compiler, header_text, tmp_path_factory):
    """The stub playing a 0.5 library (struct_size 680: the variants in the forward, no dsinks)."""
    from conftest import build_stub

    return build_stub(c_compiler, tmp_path_factory.mktemp("stub_v5"), "libflashcore_v5.so",
                      "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V5_SIZE")


def test_v5_library_gets_the_v5_struct_size(use_library, stub_v5_library):
    """A 0.5 library is passed struct_size 680: it runs the variants' forward and the plain backward; dsinks, and a
    backward with a variant (which a 0.5 library's backward refuses), are RuntimeError naming the version needed,
    before any call; nothing is written past its 680 bytes."""
    use_library(stub_v5_library)
    lib = _lib.load()
    assert lib.params_struct_size == _lib.ATTENTION_PARAMS_V5_SIZE
    assert lib.has_backward() and lib.has_variants() and lib.has_params_field("reserved4")
    assert not lib.has_variant_backward() and not lib.has_params_field("dsinks")
    params = lib.set_variants(_variant_params(lib, causal=True), causal=True, window_size=(4, 0), softcap=30.0,
                              sinks=0x5000)
    assert params.struct_size == _lib.ATTENTION_PARAMS_V5_SIZE
    lib.forward(params, 0)  # the forward takes them
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert (seen.struct_size, seen.local, seen.window_size_left, seen.softcap, seen.sinks) == (
        _lib.ATTENTION_PARAMS_V5_SIZE, 1, 4, 30.0, 0x5000)
    with pytest.raises(RuntimeError, match="dsinks .*predates the backward of the attention variants: a 0.6 library"):
        lib.set_dsinks(params, 0x6000)
    lib.set_dsinks(params, 0)  # nothing requested: nothing to refuse
    assert params.dsinks is None
    for call in (lambda: lib.backward(params, 0), lambda: lib.backward_workspace_size(params)):
        with pytest.raises(RuntimeError, match=r"backward with window_size, softcap, sinks needs a 0.6 library"):
            call()
    plain = _variant_params(lib, causal=True)
    assert lib.backward_workspace_size(plain) >= 0
    lib.backward(plain, 0)  # the plain backward runs
    lib._cdll.stub_last_backward_params(ctypes.byref(seen))
    assert seen.struct_size == _lib.ATTENTION_PARAMS_V5_SIZE and seen.local == 0 and seen.dsinks is None
    assert bytes(ctypes.string_at(ctypes.addressof(params) + _lib.ATTENTION_PARAMS_V5_SIZE,
                                  ctypes.sizeof(params) - _lib.ATTENTION_PARAMS_V5_SIZE)) == bytes(
        ctypes.sizeof(params) - _lib.ATTENTION_PARAMS_V5_SIZE)


@pytest.fixture
def stub_v6_library(c_compiler, header_text, tmp_path_factory):
    """The stub playing a 0.6 library (struct_size 688, capabilities of 304 bytes: no head_dim_v, no head dim pairs)."""
    from conftest import build_stub

    return build_stub(c_compiler, tmp_path_factory.mktemp("stub_v6"), "libflashcore_v6.so",
                      "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V6_SIZE")


def test_v6_library_gets_the_v6_struct_size(use_library, stub_v6_library):
    """A 0.6 library (which refuses the 0.7 capabilities struct) reports its capabilities through the 304-byte layout,
    is passed struct_size 688 and runs every 0.6 call; a V with a head dim of its own is RuntimeError naming the version
    needed, before any call, and nothing is written past its 688 bytes."""
    use_library(stub_v6_library)
    lib = _lib.load()
    caps = lib.capabilities()
    assert caps.params_struct_size == _lib.ATTENTION_PARAMS_V6_SIZE and caps.head_dims == (64, 128, 256)
    assert caps.head_dim_pairs == () and lib.compiled_head_dim_pairs() == ()
    assert lib.params_struct_size == _lib.ATTENTION_PARAMS_V6_SIZE
    assert lib.has_variant_backward() and lib.has_params_field("dsinks")
    assert not lib.has_head_dim_v() and not lib.has_params_field("head_dim_v") and not lib.has_kvcache_serving()
    params = lib.set_head_dim_v(_variant_params(lib, causal=True), 64)  # v of q's head dim: nothing to set
    lib.set_dsinks(params, 0x6000)
    assert params.struct_size == _lib.ATTENTION_PARAMS_V6_SIZE
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert seen.struct_size == _lib.ATTENTION_PARAMS_V6_SIZE and seen.dsinks == 0x6000 and seen.head_dim_v == 0
    with pytest.raises(RuntimeError, match=r"v's head dim \(128\) differs from q's and k's \(192\), but .*688-byte "
                                           r"flashcore_attention_params\) predates head_dim_v: a 0.7 library"):
        _mla_params(lib)
    assert bytes(ctypes.string_at(ctypes.addressof(params) + _lib.ATTENTION_PARAMS_V6_SIZE,
                                  ctypes.sizeof(params) - _lib.ATTENTION_PARAMS_V6_SIZE)) == bytes(
        ctypes.sizeof(params) - _lib.ATTENTION_PARAMS_V6_SIZE)


def test_dsinks_reach_c_intact(use_library, stub_library):
    """A 0.6 library: set_dsinks writes the field, the backward gets it with the variants."""
    use_library(stub_library)
    lib = _lib.load()
    params = lib.set_variants(_variant_params(lib), causal=False, window_size=(3, -1), softcap=20.0, sinks=0x5000)
    _lib.fill_backward_params(params, pointers=(0x6000, 0x7000, 0x8000, 0x9000), strides=((8192, 512, 64, 1),) * 4,
                              deterministic=False)
    lib.set_dsinks(params, 0xA000)
    lib.backward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_backward_params(ctypes.byref(seen))
    assert (seen.local, seen.window_size_left, seen.window_size_right, seen.softcap, seen.sinks, seen.dsinks) == (
        1, 3, -1, 20.0, 0x5000, 0xA000)
    assert ctypes.string_at(ctypes.addressof(seen), ctypes.sizeof(seen)) == ctypes.string_at(
        ctypes.addressof(params), ctypes.sizeof(params))


def test_fp8_params_reach_c_intact(use_library, stub_library):
    use_library(stub_library)
    lib = _lib.load()
    params = _lib.fill_params(
        lib.new_params(),
        pointers=(0x1000, 0x2000, 0x3000, 0x4000, 0),
        strides=((16384, 1024, 128, 1),) * 4,
        sizes=(2, 8, 8, 8, 2, 128),
        dtype=_lib.DTYPE_FP8_E4M3,
        causal=False,
        softmax_scale=0.0,
    )
    params.out_dtype = _lib.DTYPE_FP16
    params.q_descale, params.k_descale, params.v_descale = 0x5000, 0x5100, 0x5200
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert (seen.dtype, seen.out_dtype, seen.precision) == (_lib.DTYPE_FP8_E4M3, _lib.DTYPE_FP16, 0)
    assert (seen.q_descale, seen.k_descale, seen.v_descale) == (0x5000, 0x5100, 0x5200)
    params.q_descale = params.k_descale = params.v_descale = None
    params.dtype, params.precision = _lib.DTYPE_BF16, _lib.PRECISION_FP8
    lib.forward(params, 0)
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert (seen.dtype, seen.precision, seen.q_descale) == (_lib.DTYPE_BF16, _lib.PRECISION_FP8, None)


@pytest.fixture
def stub_v2_library(c_compiler, header_text, tmp_path_factory):
    """The stub playing a 0.2 library (struct_size 448, no 8-bit dtype)."""
    from conftest import build_stub

    return build_stub(c_compiler, tmp_path_factory.mktemp("stub_v2"), "libflashcore_v2.so",
                      "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V2_SIZE")


def test_v1_library_knows_no_later_field(use_library, c_compiler, header_text, tmp_path):
    """The stub playing a 0.1-sized library: struct_size 240; out_dtype (in the 0.1 struct's tail padding) and every
    later field count as unknown."""
    from conftest import build_stub

    use_library(build_stub(c_compiler, tmp_path, "libflashcore_v1.so",
                           "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V1_SIZE"))
    lib = _lib.load()
    assert lib.params_struct_size == _lib.ATTENTION_PARAMS_V1_SIZE
    assert lib.has_params_field("softmax_scale")
    assert not any(lib.has_params_field(name) for name in ("out_dtype", "workspace", "precision"))
    params = lib.new_params()
    assert params.struct_size == _lib.ATTENTION_PARAMS_V1_SIZE


def test_v2_library_gets_the_v2_struct_size(use_library, stub_v2_library):
    """A 0.2 library reports params_struct_size 448: it is passed struct_size 448, and the 0.3 fields (past its
    struct) are neither known (has_params_field) nor seen by it."""
    use_library(stub_v2_library)
    lib = _lib.load()
    assert lib.capabilities().params_struct_size == _lib.ATTENTION_PARAMS_V2_SIZE
    assert lib.params_struct_size == _lib.ATTENTION_PARAMS_V2_SIZE
    assert lib.has_params_field("seqlen_new") and lib.has_params_field("out_dtype")
    assert not lib.has_params_field("q_descale") and not lib.has_params_field("precision")
    assert "float8_e4m3fn" not in lib.compiled()[0]
    params = _lib.fill_params(
        lib.new_params(),
        pointers=(0x1000, 0x2000, 0x3000, 0x4000, 0),
        strides=((8192, 512, 64, 1),) * 4,
        sizes=(2, 3, 5, 8, 8, 64),
        dtype=_lib.DTYPE_BF16,
        causal=True,
        softmax_scale=0.0,
    )
    assert params.struct_size == _lib.ATTENTION_PARAMS_V2_SIZE
    assert params.out_dtype == _lib.DTYPE_SAME  # set by the library's init of the 0.2 layout
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert seen.struct_size == _lib.ATTENTION_PARAMS_V2_SIZE
    assert ctypes.string_at(ctypes.addressof(seen), _lib.ATTENTION_PARAMS_V2_SIZE) == ctypes.string_at(
        ctypes.addressof(params), _lib.ATTENTION_PARAMS_V2_SIZE)


def test_lse_capacity_is_passed_for_the_lse_allocated(use_library, stub_library):
    use_library(stub_library)
    lib = _lib.load()
    params = _lib.fill_params(
        lib.new_params(),
        pointers=(0x1000, 0x2000, 0x3000, 0x4000, 0x5000),
        strides=((8192, 512, 64, 1),) * 4,
        sizes=(2, 3, 5, 7, 7, 64),
        dtype=_lib.DTYPE_BF16,
        causal=False,
        softmax_scale=0.0,
    )
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert seen.lse == 0x5000 and seen.lse_capacity == 2 * 7 * 3  # batch * num_heads_q * seqlen_q


@pytest.mark.parametrize(
    "status, exc_type",
    [
        (_lib.ERROR_INVALID_STRIDE, ValueError),
        (_lib.ERROR_INVALID_HEAD_RATIO, ValueError),
        (_lib.ERROR_UNSUPPORTED_HEAD_DIM, ValueError),
        (_lib.ERROR_UNSUPPORTED_DTYPE, TypeError),
        (_lib.ERROR_NO_DEVICE, RuntimeError),
        (_lib.ERROR_CUDA, RuntimeError),
        (_lib.ERROR_INTERNAL, RuntimeError),
    ],
)
def test_failing_status_raises_with_last_error(use_library, stub_library, status, exc_type):
    use_library(stub_library)
    lib = _lib.load()
    params = lib.new_params()
    params.head_dim = 1000 + status
    with pytest.raises(exc_type) as info:
        lib.forward(params, 0)
    assert type(info.value) is exc_type
    assert f"stub failure with status {status}" in str(info.value)
    assert _lib.STATUS_NAMES[status] in str(info.value)


def test_abi_mismatch_is_refused(use_library, c_compiler, header_text, tmp_path):
    from conftest import build_stub

    bad = build_stub(c_compiler, tmp_path, "libflashcore_bad.so", "-DSTUB_BAD_STRUCT_SIZE")
    use_library(bad)
    with pytest.raises(RuntimeError, match="ABI mismatch"):
        _lib.load()


@pytest.fixture
def stub_v7_library(c_compiler, header_text, tmp_path_factory):
    """The stub playing a 0.7 library (struct_size 696: no serving fields of 0.8; the 0.7 capabilities; version
    0.7.0, whatever the header's)."""
    from conftest import build_stub

    return build_stub(c_compiler, tmp_path_factory.mktemp("stub_v7"), "libflashcore_v7.so",
                      "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V7_SIZE", "-DSTUB_VERSION_MINOR=7")


def test_v7_library_gets_the_v7_struct_size(use_library, stub_v7_library):
    """A 0.7 library is passed struct_size 696 and runs every 0.7 call (head_dim_v included); each 0.8 serving field
    is RuntimeError naming FlashAttention's argument, the field and the version needed, before any call, and nothing
    is written past its 696 bytes."""
    use_library(stub_v7_library)
    lib = _lib.load()
    caps = lib.capabilities()
    assert caps.params_struct_size == _lib.ATTENTION_PARAMS_V7_SIZE and caps.head_dim_pairs == ((192, 128),)
    assert lib.params_struct_size == _lib.ATTENTION_PARAMS_V7_SIZE
    assert lib.has_head_dim_v() and not lib.has_kvcache_serving() and not lib.has_params_field("kv_batch_idx")
    params = lib.set_kvcache_serving(_mla_params(lib))  # nothing to set: any library
    assert params.struct_size == _lib.ATTENTION_PARAMS_V7_SIZE and params.head_dim_v == 128
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert seen.struct_size == _lib.ATTENTION_PARAMS_V7_SIZE and seen.head_dim_v == 128
    for kwargs, name in ((dict(kv_batch_idx=0x7000, kv_batch_size=4), r"cache_batch_idx \(kv_batch_idx\)"),
                         (dict(leftpad_k=0x7100), r"cache_leftpad \(leftpad_k\)"),
                         (dict(cu_seqlens_k_new=0x7200, total_k_new=9), r"cu_seqlens_k_new \(cu_seqlens_k_new\)"),
                         (dict(seqused_q=0x7300), r"seqused_q \(seqused_q\)"),
                         (dict(rotary_cos=0x7400, rotary_sin=0x7500, rotary_seqlen=64, rotary_dim=32),
                          r"rotary_cos \(rotary_cos\)")):
        with pytest.raises(RuntimeError, match=name + r" is set, but .*version 0\.7\.0-stub, 696-byte "
                                                      r"flashcore_attention_params\) predates it: a 0.8 library"):
            lib.set_kvcache_serving(params, **kwargs)
    assert bytes(ctypes.string_at(ctypes.addressof(params) + _lib.ATTENTION_PARAMS_V7_SIZE,
                                  ctypes.sizeof(params) - _lib.ATTENTION_PARAMS_V7_SIZE)) == bytes(88)


def test_kvcache_serving_fields_reach_c_intact(use_library, stub_library):
    """A 0.8 library: set_kvcache_serving writes kv_batch_idx / kv_batch_size, leftpad_k, cu_seqlens_k_new /
    total_k_new at offsets 696 .. 728, and leaves a field unset when its address is 0."""
    use_library(stub_library)
    lib = _lib.load()
    params = lib.set_kvcache_serving(_mla_params(lib), kv_batch_idx=0x7000, kv_batch_size=6, leftpad_k=0x7100,
                                     cu_seqlens_k_new=0x7200, total_k_new=9)
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert (seen.kv_batch_idx, seen.kv_batch_size, seen.leftpad_k, seen.cu_seqlens_k_new, seen.total_k_new) == (
        0x7000, 6, 0x7100, 0x7200, 9)
    raw = ctypes.string_at(ctypes.addressof(seen) + 696, 40)
    assert [int.from_bytes(raw[i:i + 8], "little") for i in range(0, 40, 8)] == [0x7000, 6, 0x7100, 0x7200, 9]
    only = lib.set_kvcache_serving(_mla_params(lib), leftpad_k=0x7100, kv_batch_size=6, total_k_new=9)
    assert (only.kv_batch_idx, only.kv_batch_size, only.leftpad_k, only.cu_seqlens_k_new, only.total_k_new) == (
        None, 0, 0x7100, None, 0)


def test_seqused_q_and_rotary_fields_reach_c_intact(use_library, stub_library):
    """A 0.8 library: set_kvcache_serving writes seqused_q at 736 and the rotary fields at 744 .. 776
    (rotary_interleaved as 0 / 1), rotary_seqlens only when given; rotary_cos and rotary_sin go together, rotary_seqlens needs them."""
    use_library(stub_library)
    lib = _lib.load()
    params = lib.set_kvcache_serving(_mla_params(lib), seqused_q=0x7300, rotary_cos=0x7400, rotary_sin=0x7500,
                                     rotary_seqlen=4096, rotary_dim=64, rotary_interleaved=True,
                                     rotary_seqlens=0x7600)
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert (seen.seqused_q, seen.rotary_cos, seen.rotary_sin, seen.rotary_seqlen, seen.rotary_dim,
            seen.rotary_interleaved, seen.rotary_seqlens) == (0x7300, 0x7400, 0x7500, 4096, 64, 1, 0x7600)
    raw = ctypes.string_at(ctypes.addressof(seen) + 736, 48)
    word = lambda i, n=8: int.from_bytes(raw[i:i + n], "little")  # noqa: E731
    assert [word(0), word(8), word(16), word(24), word(32, 4), word(36, 4), word(40)] == [
        0x7300, 0x7400, 0x7500, 4096, 64, 1, 0x7600]
    neox = lib.set_kvcache_serving(_mla_params(lib), rotary_cos=0x7400, rotary_sin=0x7500, rotary_seqlen=8,
                                   rotary_dim=16, rotary_interleaved=False)
    assert (neox.rotary_interleaved, neox.rotary_seqlens, neox.seqused_q, neox.kv_batch_idx) == (0, None, None, None)
    with pytest.raises(ValueError, match="rotary_cos and rotary_sin go together"):
        lib.set_kvcache_serving(_mla_params(lib), rotary_cos=0x7400, rotary_seqlen=8, rotary_dim=16)
    with pytest.raises(ValueError, match="rotary_seqlens is set without rotary_cos"):
        lib.set_kvcache_serving(_mla_params(lib), rotary_seqlens=0x7600)
