"""Fixtures shared by every test package: the tiny Hugging Face checkpoints of ``hf_zoo``, built once per session.

How the suite compares numbers, so that it passes on every CPU (AVX2 and AVX-512 kernels round differently, and so
do different shapes, thread counts and reduction orders):

- Floats from two different computations (two kernels, batched against alone, fused against unfused, ours against
  transformers) are compared within a tolerance derived from the dtype and the magnitude
  (``tests/attention/cases.py``: fp32 accumulation plus the dtype's rounding).
- Floats are compared exactly only where the bits must agree everywhere: both sides run the same ops on the same
  inputs in one process, the values are copies (the pool's writes and reads) or exactly representable, or IEEE
  arithmetic fixes them (a product then a sum, exp(0) = 1); where that is not plain, a comment there says which.
  Integers, indices and masks are exact by nature.
- Token sequences from different paths (speculative against plain, batched against alone, cached against cold,
  ours against transformers, TP=2 against TP=1) are compared exactly: the same tokens is what those tests claim.
  Greedy choices are far from ties on the suite's models and prompts: the top logit leads the second by at least
  1e-3 (measured on the shipped dense and hybrid models, the ``hf_zoo``, hybrid and random MTP checkpoints, over
  the tokens the tests compare), while two paths' logits differ by under 1e-4 (asserted where the tests compare
  logits). A seeded draw changes only when its uniform falls within about 1e-6 of a boundary between two tokens.

Models run eagerly unless a test asks for the compiled forward (``compile=True``; ``tests/models/test_compiled.py``
compares the two): ``SMILE_COMPILE=0`` here, inherited by the servers the tests start, which would otherwise compile
and warm up for seconds each. ``SMILE_COMPILE=1 make test`` runs the whole suite compiled instead.
"""

import os

os.environ.setdefault("SMILE_COMPILE", "0")

from tests.hf_zoo import text_model, zoo  # noqa: E402, F401 - fixtures
