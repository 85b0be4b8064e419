"""Short inputs (search queries) take the cheap paths: one thread, no separate local plan."""

from __future__ import annotations

import pytest
import torch

from codesearch.encoder import load, runtime
from codesearch.encoder.attention import SdpaBackend
from codesearch.encoder.modernbert import PackedBatch
from codesearch.encoder.runtime import SMALL_FORWARD_TOKENS, single_thread


def _threads_seen_by_forward(enc, texts, kind="query"):
    seen = []
    handle = enc.backbone.model.register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    try:
        out = enc.encode(texts, kind=kind)
    finally:
        handle.remove()
    return seen, out


@pytest.mark.parametrize("busy", [True, False])
def test_short_query_threads_follow_the_load_and_restore_the_count(single_vector_dir, monkeypatch, busy):
    """A short query runs on one thread only on a busy machine; a long input keeps them all."""
    monkeypatch.setattr(runtime, "machine_busy", lambda: busy)
    enc = load(single_vector_dir, device="cpu", dtype="float32")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen, short = _threads_seen_by_forward(enc, ["where do we retry failed requests"])
        assert seen == ([1] if busy else [2]) and torch.get_num_threads() == 2
        long_text = "def f(x):\n    return x + 1\n" * 40  # well over SMALL_FORWARD_TOKENS tokens
        assert enc.count_tokens([long_text])[0] > SMALL_FORWARD_TOKENS
        seen, _ = _threads_seen_by_forward(enc, [long_text])
        assert seen == [2]
        # the single-thread path gives the same vector as the multi-threaded one
        torch.set_num_threads(2)
        with torch.inference_mode():
            ids = enc.head.tokenize(enc.tokenizer, ["where do we retry failed requests"], "query").ids
            states = enc.backbone.model(PackedBatch.from_ids(ids))
        cls = torch.nn.functional.normalize(states[:1].float(), dim=-1).numpy()
        assert abs(cls - short).max() < 1e-5
    finally:
        torch.set_num_threads(before)


def test_busy_means_a_load_above_the_cores_less_one(monkeypatch):
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 64)  # the host's count is not ours
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (0.6, 0.5, 0.5))
    assert runtime.machine_busy() is False
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (1.7, 0.5, 0.5))
    assert runtime.machine_busy() is True

    def unknown():
        raise OSError("no load average here")

    monkeypatch.setattr(runtime.os, "getloadavg", unknown)
    assert runtime.machine_busy() is True


def test_single_thread_nests_and_restores_after_errors():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with single_thread():
            with single_thread():
                assert torch.get_num_threads() == 1
            assert torch.get_num_threads() == 1  # the outer user is still inside
        assert torch.get_num_threads() == 2
        try:
            with single_thread():
                raise RuntimeError("boom")
        except RuntimeError:
            pass
        assert torch.get_num_threads() == 2
        with single_thread(enabled=False):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_sequences_within_one_window_share_the_global_plan():
    backend = SdpaBackend()
    plan = backend.plan(PackedBatch.from_ids([[1] * 65, [1] * 12]), 64)
    assert plan.local_groups is plan.global_groups and plan.blocks is None
    plan = backend.plan(PackedBatch.from_ids([[1] * 66, [1] * 12]), 64)  # one token past the window
    assert plan.local_groups is not plan.global_groups


def test_token_counter_pickles_and_counts_like_the_encoder(single_vector_dir, colbert_dir):
    import pickle

    texts = ["def f(x):\n    return x + 1\n", "", "where do we retry failed requests ünïcode"]
    for d in (single_vector_dir, colbert_dir):
        enc = load(d, device="cpu", dtype="float32")
        counter = pickle.loads(pickle.dumps(enc.token_counter()))
        assert [counter(t) for t in texts] == enc.count_tokens(texts)


def test_zero_copy_blocks_of_any_size_match_a_dense_band():
    """The strided key windows hold for block sizes other than 2w and for ragged tails."""
    from test_attention_backends import brute_force

    lengths, w = [61, 25, 97, 3], 4
    torch.manual_seed(3)
    qkv = torch.randn(sum(lengths), 3, 2, 8)
    batch = PackedBatch.from_ids([[1] * n for n in lengths])
    ref = brute_force(qkv, lengths, lengths, w)
    for block in (1, 5, 8, 13):
        backend = SdpaBackend(torch.float32, block=block)
        plan = backend.plan(batch, w)
        assert plan.blocks is not None
        assert (backend(qkv, plan, True) - ref).abs().max().item() < 1e-5
