"""Tensor parallelism inside a Ray Serve replica: the replica starts its second rank as a Ray actor in its placement
group, the two join one gloo group, and the answers equal single-process TP=1 greedy output; deleting the
application ends both ranks."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from smile_llm import LanguageModel

from .conftest import RayServe, wait_for

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def tp_cluster(ray_serve: RayServe) -> Iterator[RayServe]:
    ray_serve.run(dict(max_batch_size=4, max_seq_len=1024, tensor_parallel=2, threads=1), replicas=1,
                  cpus_per_replica=0.5)
    yield ray_serve


def test_a_tensor_parallel_replica_answers_as_one_process(tp_cluster: RayServe) -> None:
    reference = LanguageModel.default(max_batch_size=4, max_seq_len=1024)
    try:
        with httpx.Client(base_url=tp_cluster.url, timeout=120) as c:
            for k in range(3):
                messages = [{"role": "user", "content": f"tell me about rank {k}"}]
                r = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 24, "temperature": 0})
                assert r.status_code == 200, r.text
                want = reference.chat(messages, 24, temperature=0.0).text
                assert r.json()["choices"][0]["message"]["content"] == want
    finally:
        reference.close()
    assert tp_cluster.call("ranks") == 1
    tp_cluster.call("delete")
    # the rank actor ends with its replica
    wait_for(lambda: tp_cluster.call("ranks") == 0, 60, "the tensor-parallel rank ended")
