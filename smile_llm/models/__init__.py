"""Model definitions: configs, checkpoint loading and its checks, tokenizers, chat templates, the
layers, the transformer (dense, hybrid Gated DeltaNet, MoE), the MTP head, tensor-parallel sharding
and the shipped models. Nothing here knows about requests, sampling or speculation: a forward takes
token ids, positions and the pool."""
