#!/usr/bin/env bash
# The prepared GPU check: FlashInfer against the pure-PyTorch reference, CUDA-graph capture and replay, and
# fla-core's gated-delta-rule kernels against the PyTorch forms, hybrid models served on the GPU (the tests marked
# `cuda` in tests/attention/test_flashinfer_cuda.py, tests/model/test_graphs_cuda.py,
# tests/model/test_deltanet_ops_cuda.py, tests/model/test_hybrid_cuda.py, which needs transformers for its
# fixtures and skips without it, and the draft chain's test in tests/model/test_draft_chain.py).
# For a GPU machine that reaches no package index and brings its own Python 3.12 with CUDA torch, pytest and numpy:
#
#   bash scripts/gpu_check.sh --fetch-wheels   beforehand, where PyPI is reachable: saves the pinned
#                                              flashinfer-python and apache-tvm-ffi wheels (cp312, x86-64, about
#                                              22 MiB) and the pure-Python fla-core and einops ones (about 1 MiB)
#                                              in .whl/, which travels with the working tree
#   bash scripts/gpu_check.sh                  on the GPU machine (from any folder of the repo)
#
# Steps: checks that the machine's python has CUDA torch, pytest, numpy and safetensors (nothing is ever installed
# from an index); installs the pinned wheels from .whl/ into a private folder (--no-index --no-deps) unless that
# FlashInfer version already imports (fla-core: unless any fla does); prints the versions; builds exactly the
# FlashInfer JIT variants the tests use, side by side, for this GPU's architecture only; runs `pytest -m cuda` on the
# CUDA test files under a timeout;
# prints a table of every test and the totals within SMILE_GPU_BUDGET seconds of the start.
#
# Environment: PYTHON (python3), SMILE_WHEELHOUSE (.whl), SMILE_GPU_SITE (a private folder for the wheels),
# SMILE_GPU_BUDGET (seconds until the table, 470), SMILE_GPU_WARM (1: build the JIT variants first), OUT (a folder
# that receives pytest.log and junit.xml).
# Exit: 0 all passed; 1 a test failed or errored; 2 setup failed (no CUDA torch, pytest, ...); 3 FlashInfer not
# importable (bring the wheels) or no test ran on the GPU; 124 the tests ran out of time.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${SMILE_WHEELHOUSE:-.whl}
SITE=${SMILE_GPU_SITE:-${TMPDIR:-/tmp}/smile-gpu-site}
BUDGET=${SMILE_GPU_BUDGET:-470}
WARM=${SMILE_GPU_WARM:-1}
FLASHINFER_VERSION=0.6.18.post1  # pinned: an 18 MB wheel (0.7.x's is over 100 MB and would not travel)
TVM_FFI_VERSION=0.1.15.post2     # within flashinfer-python 0.6.18.post1's ">=0.1.6,<0.2,!=0.1.8"
FLA_VERSION=0.6.0                # fla-core: Triton kernels (triton comes with CUDA torch) and einops, pure Python
EINOPS_VERSION=0.8.2
CUDA_TESTS=(tests/attention/test_flashinfer_cuda.py tests/model/test_graphs_cuda.py tests/model/test_hybrid_cuda.py
            tests/model/test_deltanet_ops_cuda.py tests/model/test_draft_chain.py)

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

"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
  || fail 2 "$PY has no torch that sees a CUDA device; run with the machine's CUDA python (PYTHON=...)"
"$PY" -c 'import pytest, numpy, safetensors' 2>/dev/null \
  || fail 2 "$PY lacks pytest, numpy or safetensors; nothing is installed from a package index"

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
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" $fla_wheels \
      || fail 2 "pip could not install the carried fla-core wheels into $SITE"
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

# ------------------------------------------------------------------------------------------- versions
say "versions"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null \
  || echo "nvidia-smi: unavailable"
"$PY" -c '
import sys, torch
cap = ".".join(map(str, torch.cuda.get_device_capability(0)))
print(f"python {sys.version.split()[0]}  torch {torch.__version__} (CUDA {torch.version.cuda})  "
      f"{torch.cuda.get_device_name(0)} sm_{cap}")'
if command -v nvcc >/dev/null 2>&1; then nvcc --version | tail -n 2; else echo "nvcc: not found (FlashInfer's JIT needs it)"; fi
if ! fi_out=$("$PY" -c 'import flashinfer; print(f"flashinfer {flashinfer.__version__} at {flashinfer.__file__}")' 2>&1); then
  printf '%s\n' "$fi_out" | tail -n 5
  fail 3 "flashinfer does not import, so every cuda test would be skipped (see above)"
fi
echo "$fi_out; FLASHINFER_CUDA_ARCH_LIST=$FLASHINFER_CUDA_ARCH_LIST"
"$PY" -c 'import fla, triton; print(f"fla {fla.__version__} at {fla.__file__}; triton {triton.__version__}")' 2>&1 \
  | tail -n 1 || true

# ------------------------------------------------------------------------------------------- JIT warm-up
# FlashInfer builds each kernel variant on first use. These are exactly the variants the cuda tests use (the test
# modules' docstrings list them); built side by side they take a few minutes, one after another far longer.
if [[ $WARM == 1 ]]; then
  say "building FlashInfer's JIT variants (in parallel)"
  warm_budget=$(( BUDGET * 3 / 5 - SECONDS ))
  if (( warm_budget > 30 )); then
    MAX_JOBS=$(( ($(nproc) + 3) / 4 )) timeout --kill-after=10 "$warm_budget" "$PY" - <<'PYEOF' \
      || warn "warm-up incomplete (the tests build what is missing)"
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
        return (f"  {label:30s} {backend.kernel:9s} {time.time() - start:6.1f} s  "
                f"finite={bool(out.isfinite().all())}")
    except Exception as exc:  # shown, not fatal: the test that needs it reports it
        return f"  {label:30s} FAILED after {time.time() - start:.0f} s: {type(exc).__name__}: {str(exc)[-1500:]}"


if __name__ == "__main__":
    # fork: this parent never touches CUDA, and a script read from stdin cannot be re-imported by spawn
    with mp.get_context("fork").Pool(len(CONFIGS)) as pool:
        for line in pool.imap_unordered(build, CONFIGS):
            print(line, flush=True)
PYEOF
  else
    warn "no time left for the warm-up"
  fi
fi

# ------------------------------------------------------------------------------------------- tests
report_dir=${OUT:-$(mktemp -d)}
mkdir -p "$report_dir"
test_budget=$(( BUDGET - 15 - SECONDS ))  # leaves time to print the table
(( test_budget > 30 )) || test_budget=30
say "pytest -m cuda ${CUDA_TESTS[*]} (at most ${test_budget} s; log: $report_dir/pytest.log)"
set +e
timeout --signal=INT --kill-after=10 "$test_budget" "$PY" -m pytest -m cuda -q -rA -p no:cacheprovider \
  --junitxml="$report_dir/junit.xml" "${CUDA_TESTS[@]}" 2>&1 | tee "$report_dir/pytest.log"
rc=${PIPESTATUS[0]}
set -e

say "results"
if [[ ! -s $report_dir/junit.xml ]]; then
  tail -n 30 "$report_dir/pytest.log"
  (( rc == 124 )) && fail 124 "pytest ran out of time (${test_budget} s) before writing a report"
  fail 1 "pytest exited with $rc and wrote no report"
fi
set +e
"$PY" - "$report_dir/junit.xml" "$rc" <<'EOF'
import collections
import sys
import xml.etree.ElementTree as ET

path, rc = sys.argv[1], int(sys.argv[2])
rows, reasons = [], collections.Counter()
for case in ET.parse(path).getroot().iter("testcase"):
    module = (case.get("classname") or "").rsplit(".", 1)[-1]
    outcome = "pass"
    for child in case:
        if child.tag in ("failure", "error"):
            outcome = "FAIL" if child.tag == "failure" else "ERROR"
        elif child.tag == "skipped" and outcome == "pass":
            outcome = "skip"
            reasons[(child.get("message") or "").strip()[:120]] += 1
    rows.append((f"{module}::{case.get('name')}", outcome, float(case.get("time") or 0.0)))
width = max([len(name) for name, _, _ in rows] + [4])
print(f"{'test':{width}s}  result  seconds")
for name, outcome, secs in rows:
    print(f"{name:{width}s}  {outcome:6s}  {secs:7.2f}")
totals = collections.Counter(outcome for _, outcome, _ in rows)
print(f"\n{totals['pass']} passed, {totals['FAIL']} failed, {totals['ERROR']} errors, {totals['skip']} skipped"
      f" (pytest exit {rc})")
for reason, n in reasons.most_common(3):
    print(f"  skipped {n}: {reason}")
if rc == 124:
    sys.exit(124)
if totals["FAIL"] or totals["ERROR"]:
    sys.exit(1)
if totals["pass"] == 0:
    print("no cuda test ran on the GPU")
    sys.exit(3)
sys.exit(0 if rc == 0 else 1)
EOF
status=$?
set -e
(( status == 124 )) && warn "pytest ran out of time (${test_budget} s): the table lists what finished"

# ------------------------------------------------------------------------------------------- tensor parallel
# With two GPUs or more: TP=2 against TP=1 with NCCL (benchmarks/tensor_parallel.py --device cuda).
gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
tp_budget=$(( BUDGET - 10 - SECONDS ))
if (( gpus >= 2 && tp_budget > 60 )); then
  say "tensor parallel on 2 of $gpus GPUs (NCCL; at most ${tp_budget} s)"
  timeout --kill-after=10 "$tp_budget" "$PY" benchmarks/tensor_parallel.py --device cuda --quick \
    || warn "the tensor-parallel benchmark failed or ran out of time"
elif (( gpus < 2 )); then
  echo "tensor parallel: skipped ($gpus GPU; it needs two)"
fi
exit "$status"
