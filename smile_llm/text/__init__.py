"""Text: tokenizers (the built-in byte-level one and Hugging Face ``tokenizer.json``) and chat
templates, rendered in a sandbox under a time and size budget. Below ``models/`` and
``sampling/``, which both need a tokenizer without the model code."""
