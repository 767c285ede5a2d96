"""The server on Ray Serve: model replicas (each one model and its own prefix cache, optionally
with tensor-parallel ranks), the HTTP ingress in front of them, the cache-aware router and the
replicas' metrics. Imports the server above it; nothing in the server imports this folder."""
