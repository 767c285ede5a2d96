"""Fixtures shared by every test package: the tiny Hugging Face checkpoints of ``hf_zoo``, built once per session."""

from tests.hf_zoo import text_model, zoo  # noqa: F401 - fixtures

