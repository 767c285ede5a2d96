"""The PyTorch attention backend (exact on every device): plans over the step's CSR, gathered
or in-place reads of paged K/V, fused SDPA runs, and the log-sum-exp merge of partial results."""
