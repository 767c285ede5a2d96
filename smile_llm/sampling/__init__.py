"""Choosing tokens from logits: logits processors (penalties, bias, min tokens), warpers
(temperature, top-k, top-p, min-p), positional randomness, logprobs, and the one batched choice of
every row's next token."""
