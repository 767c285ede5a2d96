#!/usr/bin/env bash
# The prepared GPU check, in steps that each run under their own timeout, most important first:
#
#   warm-up      FlashInfer's JIT variants the tests use, built side by side for this GPU only
#   flashinfer   tests/attention/test_flashinfer_cuda.py: FlashInfer against the pure-PyTorch reference, CUDA graphs
#   token-tree   tests/attention/test_token_tree_cuda.py and the kernel-level token-tree mask case: custom-mask plans
#                on fa2 with qo_indptr on the CSR's device
#   head-dim-32  tests/attention/test_head_dim_fallback_cuda.py: the shipped models (head dim 32) fall back to the
#                reference, one warning each, and generate the CPU's tokens
#   graphs       tests/serving/test_cuda_graphs_cuda.py: CUDA-graph capture and replay on a real model
#   draft-chain  the cuda test of tests/speculative/test_draft_chain.py
#   packed-kv    tests/cache/test_pool_packed_cuda.py: low-bit KV pages quantized and decoded on the GPU, read as
#                float32 and bfloat16 views, against the float64 oracle; a model on nvfp4 KV
#   compiled     tests/models/test_compiled_cuda.py: the compiled layers (inductor) around FlashInfer, inside the
#                decode and verify CUDA graphs, against the eager forward
#   fla-core     tests/models/test_deltanet_ops_cuda.py and tests/models/test_hybrid_cuda.py (needs transformers for
#                its fixtures): fla-core's Triton kernels, with autotuning narrowed to SMILE_FLA_AUTOTUNE_CONFIGS
#                configurations per kernel (instead of up to 60, each compiled, per shape and dtype)
#   tensor-parallel  with two GPUs or more: benchmarks/tensor_parallel.py --device cuda --quick
#   gpu-vs-hf    benchmarks/gpu_vs_hf.py --device cuda in what the budget leaves: a Qwen3-0.6B-shaped model, ours
#                against transformers; $OUT/gpu_vs_hf.json keeps every figure measured, the row its headline
#
# After each step its row (step, passed / failed / timeout / skipped / not run, seconds, test counts) is appended to
# $OUT/gpu_check_table.txt and the whole table printed, so a run cut short still reports what ran. Without a CUDA
# device every step is skipped (the tests skip themselves) and the table still printed.
#
# For a GPU machine that reaches no package index and brings its own Python 3.12 with CUDA torch, pytest and numpy:
#
#   bash scripts/gpu_check.sh --fetch-wheels   beforehand, where PyPI is reachable: saves the pinned
#                                              flashinfer-python and apache-tvm-ffi wheels (cp312, x86-64, about
#                                              22 MiB) and the pure-Python fla-core and einops ones (about 1 MiB)
#                                              in .whl/, which travels with the working tree
#   bash scripts/gpu_check.sh                  on the GPU machine (from any folder of the repo)
#
# Setup: checks that the machine's python has torch, pytest, numpy and safetensors (nothing is ever installed from
# an index); with CUDA, installs the pinned wheels from .whl/ into a private folder (--no-index --no-deps) unless
# that FlashInfer version already imports (fla-core: unless any fla does) and prints the versions.
#
# Environment: PYTHON (python3), SMILE_WHEELHOUSE (.whl), SMILE_GPU_SITE (a private folder for the wheels),
# SMILE_GPU_BUDGET (seconds from the start within which every step ends and the table is printed, 470),
# SMILE_GPU_WARM (1: build the JIT variants first), SMILE_FLA_AUTOTUNE_CONFIGS (configurations kept per fla-core
# autotuned kernel, 1; 0 keeps them all), OUT (a folder that receives the table and each step's log and junit xml).
# Exit: 0 every step passed; 1 a test failed or errored; 2 setup failed (no torch, pytest, ...); 3 FlashInfer not
# importable on a CUDA machine (bring the wheels) or no test ran on the GPU; 124 a step ran out of time (or none
# was left for it).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${SMILE_WHEELHOUSE:-.whl}
SITE=${SMILE_GPU_SITE:-${TMPDIR:-/tmp}/smile-gpu-site}
BUDGET=${SMILE_GPU_BUDGET:-470}
WARM=${SMILE_GPU_WARM:-1}
FLA_CONFIGS=${SMILE_FLA_AUTOTUNE_CONFIGS:-1}
FLASHINFER_VERSION=0.6.18.post1  # pinned: an 18 MB wheel (0.7.x's is over 100 MB and would not travel)
TVM_FFI_VERSION=0.1.15.post2     # within flashinfer-python 0.6.18.post1's ">=0.1.6,<0.2,!=0.1.8"
FLA_VERSION=0.6.0                # fla-core: Triton kernels (triton comes with CUDA torch) and einops, pure Python
EINOPS_VERSION=0.8.2

say() { printf '\n== %s\n' "$*"; }
warn() { printf 'gpu_check: %s\n' "$*" >&2; }
fail() { local code=$1; shift; printf 'gpu_check: %s\n' "$*" >&2; exit "$code"; }

command -v "$PYTHON" >/dev/null 2>&1 || fail 2 "no '$PYTHON' on PATH; set PYTHON=/path/to/python3"

# ------------------------------------------------------------------------------------------- --fetch-wheels
if [[ ${1:-} == --fetch-wheels ]]; then
  mkdir -p "$WHEELS"
  say "downloading flashinfer-python==$FLASHINFER_VERSION and apache-tvm-ffi==$TVM_FFI_VERSION into $WHEELS"
  "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" \
    "flashinfer-python==$FLASHINFER_VERSION" "apache-tvm-ffi==$TVM_FFI_VERSION" \
    || fail 2 "pip could not download the wheels (is a package index reachable from here?)"
  "$PYTHON" -m pip download --no-deps --only-binary=:all: -d "$WHEELS" \
    "fla-core==$FLA_VERSION" "einops==$EINOPS_VERSION" \
    || fail 2 "pip could not download the fla-core and einops wheels"
  size_mb=$(du -sm "$WHEELS" | cut -f1)
  ls -l "$WHEELS"
  echo "$WHEELS holds ${size_mb} MiB"
  (( size_mb <= 60 )) || warn "$WHEELS is over 60 MiB: too large to travel with the working tree; remove other wheels"
  if [[ -d .git && $WHEELS != /* ]] && ! grep -qxF "/$WHEELS/" .git/info/exclude 2>/dev/null; then
    mkdir -p .git/info && echo "/$WHEELS/" >> .git/info/exclude  # never committed; carried to the GPU machine
  fi
  exit 0
fi
[[ $# -eq 0 ]] || fail 2 "unknown argument '$1' (only --fetch-wheels)"

# ------------------------------------------------------------------------------------------- environment
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH  # FlashInfer compiles its kernels on first use (JIT)
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
fi
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=$PYTHON

"$PY" -c 'import torch, pytest, numpy, safetensors' 2>/dev/null \
  || fail 2 "$PY lacks torch, pytest, numpy or safetensors; nothing is installed from a package index"
CUDA=1
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || CUDA=0
(( CUDA )) || warn "$PY's torch sees no CUDA device: every step's tests skip (run with the machine's CUDA python," \
  "PYTHON=...); the table is printed all the same"

if (( CUDA )); then
  fi_version() { "$PY" -c 'import flashinfer; print(flashinfer.__version__)' 2>/dev/null; }
  if [[ $(fi_version || true) != "$FLASHINFER_VERSION" ]]; then
    fi_wheel=$(compgen -G "$WHEELS/flashinfer_python-$FLASHINFER_VERSION-*.whl" | head -n 1 || true)
    ffi_wheel=$(compgen -G "$WHEELS/apache_tvm_ffi-$TVM_FFI_VERSION-cp312-*.whl" | head -n 1 || true)
    [[ -n $fi_wheel && -n $ffi_wheel ]] || fail 3 "flashinfer-python $FLASHINFER_VERSION does not import and" \
      "$WHEELS/ lacks its pinned wheels: run 'bash scripts/gpu_check.sh --fetch-wheels' where PyPI is reachable" \
      "and carry $WHEELS/ here"
    say "installing $(basename "$fi_wheel") and $(basename "$ffi_wheel") into $SITE (no index, no dependencies)"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$fi_wheel" "$ffi_wheel" || fail 2 "pip could not install the carried wheels into $SITE"
    export PYTHONPATH="$SITE:$PYTHONPATH"
  fi
  if ! "$PY" -c 'import fla' 2>/dev/null; then  # fla-core: without it the gated-delta-rule tests are skipped
    fla_wheels=$(compgen -G "$WHEELS/fla_core-$FLA_VERSION-*.whl"
                 compgen -G "$WHEELS/einops-$EINOPS_VERSION-*.whl") || true
    if [[ $(wc -w <<<"$fla_wheels") == 2 ]]; then
      say "installing fla-core $FLA_VERSION and einops $EINOPS_VERSION into $SITE (no index, no dependencies)"
      # shellcheck disable=SC2086
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        $fla_wheels || fail 2 "pip could not install the carried fla-core wheels into $SITE"
      [[ :$PYTHONPATH: == *":$SITE:"* ]] || export PYTHONPATH="$SITE:$PYTHONPATH"
    else
      warn "fla-core does not import and $WHEELS/ lacks its wheels: the gated-delta-rule tests will be skipped"
    fi
  fi
  # One architecture: the JIT builds for this GPU only ("a" on Hopper and later: fa3 needs sm_90a).
  if [[ -z ${FLASHINFER_CUDA_ARCH_LIST:-} ]]; then
    FLASHINFER_CUDA_ARCH_LIST=$("$PY" -c 'import torch; M, m = torch.cuda.get_device_capability(0); print(f"{M}.{m}" + ("a" if M >= 9 else ""))')
  fi
  export FLASHINFER_CUDA_ARCH_LIST
fi

# ------------------------------------------------------------------------------------------- versions
say "versions"
if (( CUDA )); then
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null \
    || echo "nvidia-smi: unavailable"
fi
"$PY" -c '
import sys, torch
gpu = "no CUDA device"
if torch.cuda.is_available():
    cap = ".".join(map(str, torch.cuda.get_device_capability(0)))
    gpu = f"{torch.cuda.get_device_name(0)} sm_{cap}"
print(f"python {sys.version.split()[0]}  torch {torch.__version__} (CUDA {torch.version.cuda})  {gpu}")'
if (( CUDA )); then
  if command -v nvcc >/dev/null 2>&1; then nvcc --version | tail -n 2; else echo "nvcc: not found (FlashInfer's JIT needs it)"; fi
  if ! fi_out=$("$PY" -c 'import flashinfer; print(f"flashinfer {flashinfer.__version__} at {flashinfer.__file__}")' 2>&1); then
    printf '%s\n' "$fi_out" | tail -n 5
    fail 3 "flashinfer does not import, so every FlashInfer test would be skipped (see above)"
  fi
  echo "$fi_out; FLASHINFER_CUDA_ARCH_LIST=$FLASHINFER_CUDA_ARCH_LIST"
fi
"$PY" -c 'import fla, triton; print(f"fla {fla.__version__} at {fla.__file__}; triton {triton.__version__}")' \
  2>/dev/null || echo "fla-core: does not import here (the fla-core step's kernel tests skip)"

# ------------------------------------------------------------------------------------------- the result table
report_dir=${OUT:-$(mktemp -d)}
mkdir -p "$report_dir"
TABLE=$report_dir/gpu_check_table.txt
printf '%-16s %-8s %8s  %s\n' step result seconds tests > "$TABLE"
echo "reports in $report_dir (the table: $TABLE)"
FAILED=0 TIMED_OUT=0 GPU_PASSED=0

# record STEP RESULT SECONDS DETAIL: one row of the table, then the whole table on stdout
record() {
  printf '%-16s %-8s %8s  %s\n' "$1" "$2" "$3" "$4" >> "$TABLE"
  case $2 in
    failed) FAILED=1 ;;
    timeout | "not run") TIMED_OUT=1 ;;
  esac
  say "results so far (budget ${BUDGET} s, ${SECONDS} s used)"
  cat "$TABLE"
}

left() { echo $(( BUDGET - 12 - SECONDS )); }  # seconds a step may still take (its kill grace, the last table)

# junit_counts XML: "P passed, F failed, E errors, S skipped" of the tests that finished (the non-zero counts)
junit_counts() {
  "$PY" - "$1" <<'EOF' 2>/dev/null || echo "no report"
import collections, sys, xml.etree.ElementTree as ET
n = collections.Counter()
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    tags = {child.tag for child in case}
    n["failed" if "failure" in tags else "errors" if "error" in tags else "skipped" if "skipped" in tags
      else "passed"] += 1
print(", ".join(f"{n[k]} {k}" for k in ("passed", "failed", "errors", "skipped") if n[k]) or "no test")
EOF
}

# run_step STEP CAP PYTEST_ARGS...: pytest -m cuda on PYTEST_ARGS within min(CAP, what the budget leaves)
run_step() {
  local step=$1 cap=$2 limit start rc counts result
  shift 2
  limit=$(left)
  (( cap < limit )) && limit=$cap
  if (( limit < 20 )); then
    record "$step" "not run" 0 "no time left in the budget"
    return
  fi
  say "$step: pytest -m cuda $* (at most ${limit} s; log $report_dir/$step.log)"
  start=$SECONDS
  set +e
  timeout --signal=INT --kill-after=10 "$limit" "$PY" -m pytest -m cuda -q -rfEs -p no:cacheprovider \
    --junitxml="$report_dir/$step.xml" "$@" 2>&1 | tee "$report_dir/$step.log"
  rc=${PIPESTATUS[0]}
  set -e
  counts=$(junit_counts "$report_dir/$step.xml")
  if (( rc == 124 || rc == 137 )); then
    result=timeout
  elif (( rc == 0 )) && [[ $counts != *" passed"* ]]; then
    result=skipped
  elif (( rc == 0 )); then
    result=passed
  elif (( rc == 5 )); then
    result=skipped counts="no test collected"
  else
    result=failed
  fi
  if [[ $counts == *" passed"* ]] && (( CUDA )); then GPU_PASSED=1; fi
  record "$step" "$result" $(( SECONDS - start )) "$counts"
}

# ------------------------------------------------------------------------------------------- JIT warm-up
# FlashInfer builds each kernel variant on first use. These are exactly the variants the cuda tests use (the test
# modules' docstrings list them); built side by side they take a few minutes, one after another far longer.
if (( ! CUDA )); then
  record warm-up skipped 0 "no CUDA device"
elif [[ $WARM != 1 ]]; then
  record warm-up skipped 0 "SMILE_GPU_WARM=$WARM"
else
  say "warm-up: building FlashInfer's JIT variants (in parallel)"
  warm_budget=$(( BUDGET * 2 / 5 - SECONDS ))
  if (( warm_budget > 30 )); then
    start=$SECONDS
    set +e
    MAX_JOBS=$(( ($(nproc) + 3) / 4 )) timeout --kill-after=10 "$warm_budget" "$PY" - <<'PYEOF' \
      2>&1 | tee "$report_dir/warm-up.log"
import multiprocessing as mp
import time

# (label, kernel family or None for the default, q dtype, kv dtype, query heads per KV head, prefill, soft cap)
CONFIGS = [
    ("decode fp16", "fa2", "float16", "float16", 1, False, None),
    ("decode bf16", "fa2", "bfloat16", "bfloat16", 1, False, None),
    ("fa2 prefill fp16", "fa2", "float16", "float16", 4, True, None),
    ("fa2 prefill bf16", "fa2", "bfloat16", "bfloat16", 4, True, None),
    ("fa2 prefill fp16 soft cap", "fa2", "float16", "float16", 4, True, 5.0),
    ("fa2 prefill bf16 q, fp8 kv", "fa2", "bfloat16", "float8_e4m3fn", 4, True, None),
    ("prefill fp16 (fa3 on Hopper)", None, "float16", "float16", 4, True, None),
    ("prefill bf16 (fa3 on Hopper)", None, "bfloat16", "bfloat16", 4, True, None),
]


def build(cfg):
    label, family, q_name, kv_name, group, prefill, cap = cfg
    start = time.time()
    try:
        import torch
        from smile_llm.attention.flashinfer import FlashInferBackend
        from smile_llm.cache.metadata import FlashInferKvMetadata

        dev, ps, hkv, d = "cuda", 16, 2, 128
        q_dtype, kv_dtype = getattr(torch, q_name), getattr(torch, kv_name)
        as32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=dev)
        meta = FlashInferKvMetadata(as32([0, 1]), as32([2]), as32([5]), ps)
        rows = 2 if prefill else 1
        backend = FlashInferBackend(dev, kernel_backend=family)
        backend.plan(meta, num_qo_heads=hkv * group, num_kv_heads=hkv, head_dim=d,
                     qo_indptr=as32([0, rows]) if prefill else None, logits_soft_cap=cap, q_dtype=q_dtype,
                     kv_dtype=kv_dtype)
        cache = torch.zeros(4, ps, hkv, d, device=dev).to(kv_dtype)
        out = backend.run(torch.ones(rows, hkv * group, d, device=dev, dtype=q_dtype), cache, cache)
        torch.cuda.synchronize()
        return (True, f"  {label:30s} {backend.kernel:9s} {time.time() - start:6.1f} s  "
                      f"finite={bool(out.isfinite().all())}")
    except Exception as exc:  # shown, not fatal: the test that needs it reports it
        return (False, f"  {label:30s} FAILED after {time.time() - start:.0f} s: {type(exc).__name__}: "
                       f"{str(exc)[-1500:]}")


if __name__ == "__main__":
    # fork: this parent never touches CUDA, and a script read from stdin cannot be re-imported by spawn
    ok = True
    with mp.get_context("fork").Pool(len(CONFIGS)) as pool:
        for built, line in pool.imap_unordered(build, CONFIGS):
            ok &= built
            print(line, flush=True)
    raise SystemExit(0 if ok else 1)
PYEOF
    rc=${PIPESTATUS[0]}
    set -e
    built=$(grep -c ' s  finite=' "$report_dir/warm-up.log" || true)
    case $rc in
      0) record warm-up passed $(( SECONDS - start )) "$built of 8 variants built" ;;
      124 | 137) record warm-up timeout $(( SECONDS - start )) "$built of 8 built (the tests build the rest)" ;;
      *) record warm-up failed $(( SECONDS - start )) "$built of 8 variants built (see warm-up.log)" ;;
    esac
  else
    record warm-up "not run" 0 "no time left in the budget"
  fi
fi

# ------------------------------------------------------------------------------------------- tests
# FlashInfer, its token-tree and head-dim-32 cases, graphs and the draft chain first; fla-core last, in its own step.
run_step flashinfer 150 tests/attention/test_flashinfer_cuda.py -k "not token_tree"
run_step token-tree 90 tests/attention/test_token_tree_cuda.py \
  "tests/attention/test_flashinfer_cuda.py::test_token_tree_masks_match_reference"
run_step head-dim-32 90 tests/attention/test_head_dim_fallback_cuda.py
run_step graphs 120 tests/serving/test_cuda_graphs_cuda.py
run_step draft-chain 60 tests/speculative/test_draft_chain.py
run_step packed-kv 90 tests/cache/test_pool_packed_cuda.py
run_step compiled 120 tests/models/test_compiled_cuda.py

# fla-core autotunes its Triton kernels over up to 60 configurations each (per shape and dtype), every one compiled
# (seconds apiece); a pytest plugin, loaded before fla, keeps SMILE_FLA_AUTOTUNE_CONFIGS of them per kernel: the
# fewest pipeline stages, then the warp counts nearest 4 (the least shared memory), in fla's own order.
plugins=$report_dir/plugins
mkdir -p "$plugins"
cat > "$plugins/smile_fla_autotune.py" <<'PYEOF'
"""Keeps SMILE_FLA_AUTOTUNE_CONFIGS configurations (0: all) in every Triton autotuner made after it is loaded,
triton.autotune's and fla's own fla_cache_autotune's alike (both construct triton's Autotuner)."""
import functools
import os

try:
    from triton.runtime.autotuner import Autotuner
except Exception:  # no Triton: nothing to narrow
    Autotuner = None

KEEP = int(os.environ.get("SMILE_FLA_AUTOTUNE_CONFIGS", "1"))


def _cost(config):
    return (getattr(config, "num_stages", 0) or 0, abs((getattr(config, "num_warps", 4) or 4) - 4))


def narrow(configs):
    if KEEP <= 0 or len(configs) <= KEEP:
        return configs
    return [configs[i] for i in sorted(sorted(range(len(configs)), key=lambda i: (_cost(configs[i]), i))[:KEEP])]


if Autotuner is not None and not getattr(Autotuner.__init__, "smile_narrowed", False):
    _init = Autotuner.__init__

    @functools.wraps(_init)
    def __init__(self, fn, arg_names, configs=None, *args, **kwargs):
        if configs is None:
            configs = kwargs.pop("configs")
        _init(self, fn, arg_names, narrow(list(configs)), *args, **kwargs)

    __init__.smile_narrowed = True
    Autotuner.__init__ = __init__
PYEOF
saved_path=$PYTHONPATH
export PYTHONPATH="$plugins:$PYTHONPATH" SMILE_FLA_AUTOTUNE_CONFIGS=$FLA_CONFIGS
run_step fla-core 240 -p smile_fla_autotune tests/models/test_deltanet_ops_cuda.py tests/models/test_hybrid_cuda.py
export PYTHONPATH=$saved_path

# ------------------------------------------------------------------------------------------- tensor parallel
# With two GPUs or more: TP=2 against TP=1 with NCCL (benchmarks/tensor_parallel.py --device cuda).
gpus=0
(( CUDA )) && gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if (( gpus >= 2 )); then
  tp_budget=$(left)
  if (( tp_budget > 60 )); then
    say "tensor parallel on 2 of $gpus GPUs (NCCL; at most ${tp_budget} s)"
    start=$SECONDS
    set +e
    timeout --kill-after=10 "$tp_budget" "$PY" benchmarks/tensor_parallel.py --device cuda --quick \
      2>&1 | tee "$report_dir/tensor-parallel.log"
    rc=${PIPESTATUS[0]}
    set -e
    case $rc in
      0) record tensor-parallel passed $(( SECONDS - start )) "TP=2 against TP=1" ;;
      124 | 137) record tensor-parallel timeout $(( SECONDS - start )) "TP=2 against TP=1" ;;
      *) record tensor-parallel failed $(( SECONDS - start )) "TP=2 against TP=1 (exit $rc)" ;;
    esac
  else
    record tensor-parallel "not run" 0 "no time left in the budget"
  fi
else
  record tensor-parallel skipped 0 "$gpus GPU; it needs two"
fi

# ------------------------------------------------------------------------------------------- gpu-vs-hf
# The benchmark last, in what the budget leaves: it skips what would not end in time (its JSON lists it, exit 124)
# and writes each figure to $OUT/gpu_vs_hf.json as it is measured, so a run cut short keeps what ran.
if (( ! CUDA )); then
  record gpu-vs-hf skipped 0 "no CUDA device"
else
  bench_limit=$(left)
  if (( bench_limit >= 60 )); then
    say "gpu-vs-hf: benchmarks/gpu_vs_hf.py --device cuda (at most ${bench_limit} s; log $report_dir/gpu-vs-hf.log)"
    start=$SECONDS
    set +e
    timeout --signal=INT --kill-after=10 "$bench_limit" "$PY" benchmarks/gpu_vs_hf.py --device cuda \
      --budget $(( bench_limit - 25 )) --out "$report_dir/gpu_vs_hf.json" 2>&1 | tee "$report_dir/gpu-vs-hf.log"
    rc=${PIPESTATUS[0]}
    set -e
    headline=$(sed -n 's/^headline: //p' "$report_dir/gpu-vs-hf.log" | tail -n 1)
    case $rc in
      0) record gpu-vs-hf passed $(( SECONDS - start )) "$headline" ;;
      124 | 137) record gpu-vs-hf timeout $(( SECONDS - start )) \
        "${headline:-cut short}; gpu_vs_hf.json holds what ran" ;;
      *) record gpu-vs-hf failed $(( SECONDS - start )) "exit $rc (gpu-vs-hf.log; gpu_vs_hf.json holds what ran)" ;;
    esac
  else
    record gpu-vs-hf "not run" 0 "no time left in the budget"
  fi
fi

# ------------------------------------------------------------------------------------------- verdict
if (( FAILED )); then
  fail 1 "a step failed (the table above; logs in $report_dir)"
elif (( TIMED_OUT )); then
  fail 124 "a step ran out of time or had none left (the table above lists what finished)"
elif (( ! GPU_PASSED )); then
  fail 3 "no test ran on the GPU"
fi
echo "every step passed"
