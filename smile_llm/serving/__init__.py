"""One request path: validated requests, the row a scheduler advances (``RequestRow``), the
scheduler, the model runner (prefill, decode and speculative steps), CUDA-graph runners, streaming,
sample groups and the serving loop that drives them."""
