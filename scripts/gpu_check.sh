#!/usr/bin/env bash
# The prepared GPU check: FlashInfer against the pure-PyTorch reference, and CUDA-graph capture and replay
# (every test marked `cuda`: tests/attention/test_flashinfer_cuda.py and tests/engine/test_graphs_cuda.py, the
# decode and verify graph runners). One short call on a GPU machine:
#
#   bash scripts/gpu_check.sh                  on the GPU machine (from any folder of the repo)
#   bash scripts/gpu_check.sh --fetch-wheels   where PyPI is reachable: saves flashinfer-python and apache-tvm-ffi
#                                              wheels (cp312, x86-64) in .whl/ for a GPU machine without network
#
# Steps: a venv (.venv-gpu) that also sees the creating python's packages (an installed CUDA torch is reused, not
# downloaded); torch with CUDA, flashinfer-python and the package installed only when missing (from .whl/ first,
# then the package index); versions printed; FlashInfer's JIT modules built in parallel; `pytest -m cuda -q -rA
# tests/` under a timeout; a table of every test and the totals.
#
# Environment: PYTHON (python3), SMILE_GPU_VENV (.venv-gpu), SMILE_WHEELHOUSE (.whl), SMILE_GPU_BUDGET (seconds for
# the whole check, 560), SMILE_GPU_WARM (1: build the JIT modules first, in parallel), FLASHINFER_VERSION (for
# --fetch-wheels; 0.6.18.post1, an 18 MB wheel, where 0.7.4's 101 MB would not travel), OUT (a folder that
# receives pytest.log and junit.xml).
# Exit: 0 all passed; 1 a test failed or errored; 2 setup failed (no CUDA torch, pip, ...); 3 flashinfer missing
# or no test ran on the GPU; 124 the tests ran out of time.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
VENV=${SMILE_GPU_VENV:-.venv-gpu}
WHEELS=${SMILE_WHEELHOUSE:-.whl}
BUDGET=${SMILE_GPU_BUDGET:-560}
WARM=${SMILE_GPU_WARM:-1}
FLASHINFER_VERSION=${FLASHINFER_VERSION:-0.6.18.post1}
TVM_FFI_SPEC='apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0'
INDEX_DOWN=0

say() { printf '\n== %s\n' "$*"; }
warn() { printf 'gpu_check: %s\n' "$*" >&2; }
fail() { local code=$1; shift; printf 'gpu_check: %s\n' "$*" >&2; exit "$code"; }

command -v "$PYTHON" >/dev/null 2>&1 || fail 2 "no '$PYTHON' on PATH; set PYTHON=/path/to/python3"

# ------------------------------------------------------------------------------------------- --fetch-wheels
if [[ ${1:-} == --fetch-wheels ]]; then
  mkdir -p "$WHEELS"
  say "downloading flashinfer-python==$FLASHINFER_VERSION and apache-tvm-ffi into $WHEELS"
  "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version "${WHEEL_PYTHON:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" \
    "flashinfer-python==$FLASHINFER_VERSION" "$TVM_FFI_SPEC" \
    || fail 2 "pip could not download the wheels (is a package index reachable from here?)"
  size_mb=$(du -sm "$WHEELS" | cut -f1)
  ls -l "$WHEELS"
  echo "$WHEELS holds ${size_mb} MiB"
  if (( size_mb > 60 )); then
    warn "$WHEELS is over 60 MiB: too large to travel with the working tree; pick an older FLASHINFER_VERSION"
  fi
  if [[ -d .git && $WHEELS != /* ]] && ! grep -qxF "/$WHEELS/" .git/info/exclude 2>/dev/null; then
    echo "/$WHEELS/" >> .git/info/exclude  # never committed; carried to the GPU machine explicitly
  fi
  exit 0
fi
[[ $# -eq 0 ]] || fail 2 "unknown argument '$1' (only --fetch-wheels)"

# ------------------------------------------------------------------------------------------- environment
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH  # FlashInfer compiles its kernels on first use (JIT)
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
fi
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [[ ! -x $VENV/bin/python ]]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV" 2>/dev/null || "$PYTHON" -m venv --without-pip "$VENV" \
    || fail 2 "'$PYTHON -m venv $VENV' failed (install python3-venv, or set PYTHON)"
  # A venv made by a venv's python does not see that venv's packages (--system-site-packages reaches only the
  # base install); a .pth file adds the creating interpreter's site folders after the venv's own.
  site_dir=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$PYTHON" -c 'import site, sys; print("\n".join(p for p in site.getsitepackages() + [site.getusersitepackages()]))' \
    > "$site_dir/_gpu_check_parent_site.pth"
fi
PY=$VENV/bin/python
if "$PY" -m pip --version >/dev/null 2>&1; then
  PIP=("$PY" -m pip)
else
  PIP=("$PYTHON" -m pip --python "$PY")  # pip >= 22.3 installs into another environment
fi

have_wheels() { [[ -d $WHEELS ]] && compgen -G "$WHEELS/*.whl" >/dev/null; }

pip_install() {  # pip_install SPEC...: from the wheelhouse when it has wheels, else from the package index
  if have_wheels; then
    "${PIP[@]}" install -q --no-index --find-links "$WHEELS" --no-deps "$@" && return 0
    warn "installing $* from $WHEELS failed"
  fi
  if (( INDEX_DOWN )); then return 1; fi
  if "${PIP[@]}" install -q --timeout 20 --retries 1 "$@"; then return 0; fi
  INDEX_DOWN=1
  warn "pip could not install $* from a package index (none reachable from this machine?). Bring wheels: run" \
       "'bash scripts/gpu_check.sh --fetch-wheels' where PyPI is reachable and carry $WHEELS/ along"
  return 1
}

# ------------------------------------------------------------------------------------------- installs
cuda_torch() { "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
if ! cuda_torch; then
  say "torch with CUDA is not importable: installing torch"
  pip_install torch || true
  cuda_torch || fail 2 "torch cannot use a CUDA device here (see nvidia-smi below); install a CUDA build of torch"
fi

fi_import() { "$PY" -c 'import flashinfer' 2>&1; }
if ! fi_import >/dev/null; then
  say "flashinfer is not importable: installing flashinfer-python"
  if have_wheels; then
    pip_install flashinfer-python "$TVM_FFI_SPEC" || true
  else
    pip_install flashinfer-python || true
  fi
fi

if ! "$PY" -c 'import pytest, hypothesis' 2>/dev/null; then
  say "installing the test dependencies"
  pip_install pytest hypothesis pytest-timeout || fail 2 "pytest and hypothesis are needed"
fi
if [[ ! -e $VENV/.smile-llm-installed ]]; then
  if "${PIP[@]}" install -q --no-deps --no-build-isolation -e . 2>/dev/null; then
    touch "$VENV/.smile-llm-installed"
  else
    warn "editable install of the package failed; the tests import it from $PWD (PYTHONPATH)"
  fi
fi

# ------------------------------------------------------------------------------------------- versions
say "versions"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null \
  || echo "nvidia-smi: unavailable"
"$PY" - <<'EOF'
import sys, torch
cap = ".".join(map(str, torch.cuda.get_device_capability(0)))
print(f"python {sys.version.split()[0]}  torch {torch.__version__} (CUDA {torch.version.cuda})  "
      f"{torch.cuda.get_device_name(0)} sm_{cap}")
EOF
if command -v nvcc >/dev/null 2>&1; then
  nvcc --version | tail -n 2
else
  echo "nvcc: not found (FlashInfer's JIT needs it)"
fi
if fi_out=$(fi_import); then
  "$PY" -c 'import flashinfer; print(f"flashinfer {flashinfer.__version__} at {flashinfer.__file__}")'
else
  printf '%s\n' "$fi_out" | tail -n 5
  fail 3 "flashinfer is not importable, so every cuda test would be skipped. On a machine without network run" \
         "'bash scripts/gpu_check.sh --fetch-wheels' where PyPI is reachable and carry $WHEELS/ here"
fi

# ------------------------------------------------------------------------------------------- JIT warm-up
# FlashInfer builds each kernel variant on first use; the tests need six. Built one after another they take
# minutes; here they build side by side, a few compile jobs each.
if [[ $WARM == 1 ]]; then
  say "building FlashInfer's JIT modules (in parallel)"
  warm_budget=$(( BUDGET / 2 - SECONDS ))
  if (( warm_budget > 30 )); then
    MAX_JOBS=$(( ($(nproc) + 3) / 4 )) timeout --kill-after=10 "$warm_budget" "$PY" - <<'EOF' \
      || warn "warm-up incomplete (the tests build what is missing)"
import multiprocessing as mp
import time

CONFIGS = [  # (label, q dtype, kv dtype, query heads per KV head, prefill, soft cap): what the cuda tests use
    ("decode fp16", "float16", "float16", 1, False, None),
    ("decode bf16", "bfloat16", "bfloat16", 1, False, None),
    ("prefill fp16", "float16", "float16", 4, True, None),
    ("prefill bf16", "bfloat16", "bfloat16", 4, True, None),
    ("prefill fp16 soft cap", "float16", "float16", 4, True, 5.0),
    ("prefill bf16 q, fp8 kv", "bfloat16", "float8_e4m3fn", 4, True, None),
]


def build(cfg):
    label, q_name, kv_name, group, prefill, cap = cfg
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
        backend = FlashInferBackend(dev)
        backend.plan(meta, num_qo_heads=hkv * group, num_kv_heads=hkv, head_dim=d,
                     qo_indptr=as32([0, rows]) if prefill else None, logits_soft_cap=cap, q_dtype=q_dtype,
                     kv_dtype=kv_dtype)
        cache = torch.zeros(4, ps, hkv, d, device=dev).to(kv_dtype)
        out = backend.run(torch.ones(rows, hkv * group, d, device=dev, dtype=q_dtype), cache, cache)
        torch.cuda.synchronize()
        return f"  {label:24s} {backend.kernel:10s} {time.time() - start:6.1f} s  finite={bool(out.isfinite().all())}"
    except Exception as exc:  # shown, not fatal: the test that needs it reports it
        return f"  {label:24s} FAILED after {time.time() - start:.0f} s: {type(exc).__name__}: {str(exc)[-1500:]}"


if __name__ == "__main__":
    # fork: this parent never touches CUDA, and a script read from stdin cannot be re-imported by spawn
    with mp.get_context("fork").Pool(len(CONFIGS)) as pool:
        for line in pool.imap_unordered(build, CONFIGS):
            print(line, flush=True)
EOF
  else
    warn "no time left for the warm-up"
  fi
fi

# ------------------------------------------------------------------------------------------- tests
report_dir=${OUT:-$(mktemp -d)}
mkdir -p "$report_dir"
test_budget=$(( BUDGET - SECONDS ))
(( test_budget > 30 )) || test_budget=30
say "pytest -m cuda -q -rA tests/ (at most ${test_budget} s; log: $report_dir/pytest.log)"
set +e
timeout --signal=INT --kill-after=20 "$test_budget" "$PY" -m pytest -m cuda -q -rA -p no:cacheprovider \
  --junitxml="$report_dir/junit.xml" tests/ 2>&1 | tee "$report_dir/pytest.log"
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
exit "$status"
