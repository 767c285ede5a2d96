"""A checkpoint folder, checked before anything is allocated: ``config.json`` read into
``ModelConfig`` (typed, range-checked fields; the hybrid families' part), the safetensors
headers, the checks that the tensors agree with the config, and the weights' loading."""
