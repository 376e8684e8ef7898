#!/usr/bin/env bash
# FlashAttention-3's own tests against FlashCore: test_flash_attn_output, test_flash_attn_varlen_output and
# test_flash_attn_kvcache of FA3's hopper/test_flash_attn.py, unmodified, with `flash_attn_interface` resolved to
# FlashCore's shim (tests/fa3_compat/flash_attn_interface.py: FA3's names on flashcore's public API; what FlashCore
# lacks skips, naming it) and the plugin tests/fa3_compat/fa3_plugin.py (sampling, time budget, summary). For a GPU
# machine with a built library; nothing is compiled here.
#
#   bash tools/run_fa3_tests.sh SUMMARY_FILE [extra pytest arguments]
#
# Writes SUMMARY_FILE (passed / failed / skipped per test function, skips grouped by reason, the run's settings) and
# SUMMARY_FILE.json, and prints the summary. Exit status: pytest's (0: nothing failed, 1: failures, 5: nothing ran),
# 2 for a missing piece here, 4 when the plugin stops the run (no library, another flash_attn_interface).
#
# Needs:
#   - FA3's files in .carry/fa3tests/ (or $FLASHCORE_FA3_DIR): test_flash_attn.py, test_util.py, padding.py, fetched
#     unmodified (SOURCE.txt there names the commit). They are not FlashCore's and are never committed (.carry/ is
#     ignored by git); einops, which they import, is installed from its wheel in wheels/ there when python3 lacks it.
#   - The library: $FLASHCORE_LIBRARY, else build/lib/libflashcore.so, else unpacked from .carry/pack.tar.xz
#     (tools/device_pack.sh).
#
# Environment (default):
#   FLASHCORE_FA3_K ("test_flash_attn_output or test_flash_attn_varlen_output or test_flash_attn_kvcache"): pytest -k.
#   FLASHCORE_FA3_SAMPLE ("test_flash_attn_output=8,test_flash_attn_varlen_output=16,test_flash_attn_kvcache=32"):
#       keep about one parametrization in N per test function (deterministic: crc32 of the item's name); "1" keeps
#       all. The default runs about 5,350 of the 96,768 parametrizations collected with the flags below.
#   FLASHCORE_FA3_SAMPLE_SEED (0): another seed draws another sample of the same size.
#   FLASHCORE_FA3_SELECT (""): parameter filter, e.g. "dtype=bfloat16|float16,d=128" (fa3_plugin.py).
#   FLASHCORE_FA3_BUDGET_S (230): stop starting tests after this many seconds (the items run in an interleaved,
#       hash-shuffled order, so a cut leaves an even part of each function's sample; the summary counts what did not
#       run). 0: no budget.
#   FLASHCORE_FA3_HINTS (skip): skip | ignore, for FA3's strategy hints (pack_gqa=True, num_splits > 1, sm_margin,
#       get_scheduler_metadata): skip them, or run the call with FlashCore's own strategy (flash_attn_interface.py).
#   FLASHCORE_FA3_MAXFAIL (unset): pytest --maxfail.
#   FLASH_ATTENTION_DISABLE_LOCAL (FALSE): FA3's own switch for a build without local attention, read by its test
#       module. FALSE runs FA3's local tests: window_size, and attention_chunk, which the shim passes on as
#       flashcore's attention_chunk (the same semantics). Each test loops over values inside its body and a skip ends
#       the whole test: every test_flash_attn_output item, the varlen ones with seqlen_q <= seqlen_k and the causal or
#       local KV-cache ones first run with a random attention_chunk > 0 (the forward only: FA3 checks no backward
#       with a chunk), then with attention_chunk = 0 (forward and backward). With a library that predates chunked
#       attention (it refuses the field as reserved: the shim skips, quoting it) those items end at their first
#       call; TRUE then runs the rest without local attention (no window_size, no attention_chunk drawn).
#   FLASH_ATTENTION_DISABLE_SPLIT, FLASH_ATTENTION_DISABLE_PACKGQA (TRUE each): every test's second call asks for
#       num_splits=3 or pack_gqa=True (FA3 strategies, which the shim skips by default): without these flags every
#       test_flash_attn_output item would skip before its backward was checked. The cost: the KV-cache test's
#       num_splits 3 / 0, which FlashCore takes, are not drawn. Any other FLASH_ATTENTION_* in the environment is
#       passed on as it is.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
summary=$1
shift
[[ $summary == /* ]] || summary=$root/$summary
mkdir -p "$(dirname "$summary")"

fa3_dir=${FLASHCORE_FA3_DIR:-.carry/fa3tests}
[[ $fa3_dir == /* ]] || fa3_dir=$root/$fa3_dir
for f in test_flash_attn.py test_util.py padding.py; do
  if [[ ! -f $fa3_dir/$f ]]; then
    echo "run_fa3_tests.sh: $fa3_dir/$f is missing: fetch FA3's hopper/$f (see tests/fa3_compat/README.md)" >&2
    exit 2
  fi
done

if [[ -z ${FLASHCORE_LIBRARY:-} ]]; then
  if [[ ! -f build/lib/libflashcore.so && -f .carry/pack.tar.xz ]]; then
    tar -xJf .carry/pack.tar.xz || { echo "run_fa3_tests.sh: could not unpack .carry/pack.tar.xz" >&2; exit 2; }
  fi
  if [[ ! -f build/lib/libflashcore.so ]]; then
    echo "run_fa3_tests.sh: no library: set FLASHCORE_LIBRARY or build build/lib/libflashcore.so" >&2
    exit 2
  fi
  export FLASHCORE_LIBRARY=$root/build/lib/libflashcore.so
fi

extra_path=""
if ! python3 -c "import einops" 2>/dev/null; then
  site=$(mktemp -d /tmp/fa3_site.XXXXXX)
  wheel=$(ls "$fa3_dir"/wheels/einops-*.whl 2>/dev/null | head -1)
  if [[ -z $wheel ]] || ! python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel"; then
    echo "run_fa3_tests.sh: python3 has no einops and $fa3_dir/wheels/ has no wheel of it" >&2
    exit 2
  fi
  extra_path=:$site
fi

export PYTHONPATH=$root/tests/fa3_compat:$root/python:$fa3_dir$extra_path${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export FLASH_ATTENTION_DISABLE_LOCAL=${FLASH_ATTENTION_DISABLE_LOCAL:-FALSE}
export FLASH_ATTENTION_DISABLE_SPLIT=${FLASH_ATTENTION_DISABLE_SPLIT:-TRUE}
export FLASH_ATTENTION_DISABLE_PACKGQA=${FLASH_ATTENTION_DISABLE_PACKGQA:-TRUE}
export FLASHCORE_FA3_SAMPLE=${FLASHCORE_FA3_SAMPLE:-test_flash_attn_output=8,test_flash_attn_varlen_output=16,test_flash_attn_kvcache=32}
export FLASHCORE_FA3_BUDGET_S=${FLASHCORE_FA3_BUDGET_S:-230}
export FLASHCORE_FA3_INTERLEAVE=1
export FLASHCORE_FA3_SUMMARY=$summary
keyword=${FLASHCORE_FA3_K:-test_flash_attn_output or test_flash_attn_varlen_output or test_flash_attn_kvcache}
maxfail=()
[[ -n ${FLASHCORE_FA3_MAXFAIL:-} ]] && maxfail=(--maxfail="$FLASHCORE_FA3_MAXFAIL")

rm -f "$summary" "$summary.json"
python3 -m pytest "$fa3_dir/test_flash_attn.py" -k "$keyword" -q -rN -p fa3_plugin -p no:cacheprovider \
  --rootdir="$root" "${maxfail[@]}" "$@"
rc=$?
echo
if [[ -f $summary ]]; then
  cat "$summary"
else
  echo "run_fa3_tests.sh: pytest wrote no summary (exit status $rc)"
fi
exit $rc
