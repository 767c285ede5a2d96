"""Two replicas of the shipped model on a local Ray Serve (``num_cpus=2``), behind the cache-aware router: every
answer equals single-process greedy output (chat, completions, streams, errors); a conversation's next turn, sent as
soon as the answer is complete, goes to the replica that served it and finds its turns cached; a replica killed under
load is restarted by Ray Serve while the other replica's requests all complete, the dead one's streams end cleanly,
its summary leaves the router and nothing hangs."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from smile_llm import LanguageModel

from .conftest import RayServe, wait_for

pytestmark = pytest.mark.ray
CI = os.environ.get("SMILE_TEST_SCALE", "full") == "ci"
CONVERSATIONS = 4 if CI else 8
STREAMS = 6 if CI else 12
TIMEOUT = httpx.Timeout(120.0)
SYSTEM = "You are assistant number {k}. Answer briefly and precisely, in plain words, for tenant {k}. " * 3


@pytest.fixture(scope="module")
def reference() -> Iterator[LanguageModel]:
    lm = LanguageModel.default(drafter=None, max_batch_size=8, max_seq_len=2048)
    yield lm
    lm.close()


@pytest.fixture(scope="module")
def cluster(ray_serve: RayServe) -> Iterator[RayServe]:
    # pending_ttl_s=0: a routed prompt does not count as cached, so the next turn is placed by the summaries alone
    ray_serve.run(dict(max_batch_size=8, max_seq_len=2048, threads=1), dict(model_name="smile-test"), replicas=2,
                  cpus_per_replica=1.0, stats_period_s=1.0, stall_timeout_s=30.0, router_kwargs={"pending_ttl_s": 0.0})
    yield ray_serve


def chat(c: httpx.Client, messages: list[dict[str, str]], max_tokens: int = 16) -> httpx.Response:
    r = c.post("/v1/chat/completions", json={"model": "smile-test", "messages": messages, "max_tokens": max_tokens,
                                             "temperature": 0})
    assert r.status_code == 200, r.text
    return r


def test_every_answer_equals_single_process_greedy_output(cluster: RayServe, reference: LanguageModel) -> None:
    cases: list[tuple[str, dict[str, Any]]] = []
    for k in range(4):
        cases.append(("/v1/chat/completions", {"messages": [{"role": "system", "content": SYSTEM.format(k=k)},
                                                            {"role": "user", "content": f"question {k}"}],
                                               "max_tokens": 24, "temperature": 0, "stream": k % 2 == 1}))
    for k in range(2):
        cases.append(("/v1/completions", {"prompt": f"def function_{k}(x):\n    ", "max_tokens": 24,
                                          "temperature": 0, "stream": k == 1}))
    results: list[Any] = [None] * len(cases)

    def send(i: int) -> None:
        path, body = cases[i]
        with httpx.Client(base_url=cluster.url, timeout=TIMEOUT) as c:
            r = c.post(path, json=body)
            results[i] = (r.status_code, r.text)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads)
    for (path, body), (status, text) in zip(cases, results):
        assert status == 200, text
        if body["stream"]:
            events = [json.loads(x[6:]) for x in text.splitlines() if x.startswith("data: ") and x != "data: [DONE]"]
            got = "".join(e["choices"][0]["delta"].get("content", "") if "delta" in e["choices"][0]
                          else e["choices"][0]["text"] for e in events)
            assert text.rstrip().endswith("data: [DONE]")
        else:
            choice = json.loads(text)["choices"][0]
            got = choice["message"]["content"] if "message" in choice else choice["text"]
        ids = (reference.encode_chat(body["messages"], True) if "messages" in body
               else reference.encode(body["prompt"]))
        assert got == reference.generate(ids, body["max_tokens"], temperature=0.0).text
    # errors are the single server's errors
    with httpx.Client(base_url=cluster.url, timeout=TIMEOUT) as c:
        bad = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": -1})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
        assert c.post("/v1/chat/completions", json={"model": "other", "messages": []}).status_code in (400, 404)
        assert c.get("/v1/models").json()["data"][0]["id"] == "smile-test"
        assert c.get("/health").status_code == 200


def test_each_replicas_metrics_are_exported_by_ray_labelled_by_replica(cluster: RayServe) -> None:
    answered: set[str] = set()
    with httpx.Client(base_url=cluster.url, timeout=TIMEOUT) as c:
        for k in range(4):
            answered.add(chat(c, [{"role": "user", "content": f"metrics {k} " * 20}], 2).headers["x-smile-llm-replica"])

    def exported() -> set[str]:
        try:
            text = httpx.get(cluster.metrics_url, timeout=10).text
        except httpx.HTTPError:
            return set()
        return {line.split('replica="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("ray_smile_llm_requests_total{") and 'status="200"' in line
                and 'deployment="ModelReplica"' in line}
    wait_for(lambda: answered <= exported(), 60, f"Ray exporting the metrics of {answered}")


def test_a_conversations_next_turn_goes_to_the_replica_that_served_it(cluster: RayServe) -> None:
    conversations = [[{"role": "system", "content": SYSTEM.format(k=100 + k)},
                      {"role": "user", "content": "first question"}] for k in range(CONVERSATIONS)]
    served: list[list[str]] = [[] for _ in conversations]
    before = [0] * len(conversations)  # each conversation's previous prompt, in whole pages
    page = LanguageModel.default(drafter=None, max_batch_size=1).pool.page_size
    with httpx.Client(base_url=cluster.url, timeout=TIMEOUT) as c:
        for turn in range(3):
            for k, messages in enumerate(conversations):
                r = chat(c, messages)
                served[k].append(r.headers["x-smile-llm-replica"])
                usage = r.json()["usage"]
                # the previous turn's prompt (a prefix of this one) was cached where this turn went
                assert usage["prompt_tokens_details"]["cached_tokens"] >= before[k], (k, turn, usage)
                before[k] = usage["prompt_tokens"] // page * page
                messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                             {"role": "user", "content": f"follow-up {turn}"}]
    for k, replicas in enumerate(served):
        assert len(set(replicas)) == 1, (k, replicas)


def test_a_replica_killed_under_load(cluster: RayServe, reference: LanguageModel) -> None:
    prompts = [f"# stream {k}\nclass Item{k}:\n    def __init__(self):\n        " for k in range(STREAMS)]
    new_tokens = 240
    want = [c.text for c in reference.generate_batch([reference.encode(p) for p in prompts], new_tokens,
                                                     temperature=0.0, min_new_tokens=new_tokens)]
    streaming = [threading.Event() for _ in prompts]  # set at a stream's first token (or its end)
    outcomes: list[Any] = [None] * STREAMS

    def stream(k: int) -> None:
        body = {"prompt": prompts[k], "max_tokens": new_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
        text, error, done, replica, status = "", None, False, None, None
        try:
            with httpx.Client(base_url=cluster.url, timeout=TIMEOUT) as c, c.stream("POST", "/v1/completions",
                                                                                     json=body) as r:
                replica, status = r.headers.get("x-smile-llm-replica"), r.status_code
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        event = json.loads(line[6:])
                        if "error" in event:
                            error = event["error"]["message"]
                        else:
                            text += event["choices"][0]["text"]
                            streaming[k].set()
        finally:
            outcomes[k] = (replica, status, text, error, done)
            streaming[k].set()

    threads = [threading.Thread(target=stream, args=(k,), daemon=True) for k in range(STREAMS)]
    for t in threads:
        t.start()
    for event in streaming:
        assert event.wait(120), "a stream did not start"
    with httpx.Client(base_url=cluster.url, timeout=TIMEOUT) as c:
        victim = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).headers["x-smile-llm-replica"]
    cluster.call("kill", replica=victim)
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), "a stream hung"
    survivors = 0
    for k, (replica, status, text, error, done) in enumerate(outcomes):
        assert status == 200
        if replica != victim:
            survivors += 1
            assert done and error is None and text == want[k], k  # the other replica's requests are untouched
        else:  # finished before the kill, or ended with a clean error event
            assert (done and error is None and text == want[k]) or (
                not done and error.startswith("the replica was lost") and want[k].startswith(text)), (k, error)
    assert survivors > 0
    # Ray Serve starts a replacement; the router forgets the dead replica's summary
    wait_for(lambda: cluster.running() == 2, 180, "two model replicas running again")
    wait_for(lambda: victim not in cached_prefixes(cluster), 60, "the dead replica's summary dropped")
    with httpx.Client(base_url=cluster.url, timeout=TIMEOUT) as c:
        r = chat(c, [{"role": "user", "content": "still there?"}])
        assert r.headers["x-smile-llm-replica"] != victim


def cached_prefixes(cluster: RayServe) -> dict[str, float]:
    """Replica unique id -> the prefix hashes the router's board holds for it (the ingress's /metrics)."""
    text = httpx.get(cluster.url + "/metrics", timeout=30).text
    return {line.split('replica="')[1].split('"')[0].rsplit("#", 1)[-1]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("smile_llm_ingress_cached_prefixes{")}
