"""Our packed ModernBERT against transformers' ModernBertModel on the same random weights."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from fixtures.models import CODE_CORPUS

from codesearch.encoder import load
from codesearch.encoder.modernbert import GLOBAL, LOCAL, ModernBertConfig
from codesearch.encoder.runtime import padded_inputs

# Long texts cross the fixture's local window (local_attention=128: 64 tokens each side) and
# the 3w = 192-token threshold where local layers switch to blocked attention.
TEXTS = [
    "def f(x): return x + 1",
    "",  # [CLS][SEP]
    " ".join(CODE_CORPUS),  # ~230 tokens
    " ".join(CODE_CORPUS * 3),  # ~700 tokens
    "x",
    "\n".join(CODE_CORPUS[:4]),  # ~100 tokens: longer than the window, attended whole
    " ".join(CODE_CORPUS * 2)[:700],
]


@functools.cache
def hf_model(directory: str, attn: str):
    """transformers' own ModernBertModel on the checkpoint, fp32 (loaded once per test session)."""
    from transformers import ModernBertModel

    return ModernBertModel.from_pretrained(directory, attn_implementation=attn, dtype=torch.float32).eval()


def reference_hidden(directory, ids: list[list[int]], attn: str = "sdpa") -> list[torch.Tensor]:
    """transformers' ModernBertModel, fp32, one right-padded batch, real tokens only."""
    model = hf_model(str(directory), attn)
    input_ids, mask = padded_inputs(ids, model.config.pad_token_id)
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    return [out[i, : len(x)] for i, x in enumerate(ids)]


@pytest.fixture(scope="module", params=["legacy", "new"])
def checkpoint(request, modernbert_dir, modernbert_new_dir):
    return modernbert_dir if request.param == "legacy" else modernbert_new_dir


@pytest.fixture(scope="module")
def enc32(checkpoint):
    return load(checkpoint, device="cpu", dtype="float32")


def test_config_forms_agree(modernbert_dir, modernbert_new_dir):
    legacy = ModernBertConfig.from_hf_dict(json.loads((modernbert_dir / "config.json").read_text()))
    new = ModernBertConfig.from_hf_dict(json.loads((modernbert_new_dir / "config.json").read_text()))
    assert legacy == new
    assert legacy.layer_types == (GLOBAL, LOCAL, LOCAL, GLOBAL)
    assert (legacy.global_rope_theta, legacy.local_rope_theta, legacy.window) == (160_000.0, 10_000.0, 64)


def test_from_hf_dict_ignores_unknown_keys(modernbert_dir):
    d = json.loads((modernbert_dir / "config.json").read_text())
    d.update(some_future_key=[1, 2], reference_compile=True)
    assert ModernBertConfig.from_hf_dict(d).hidden_size == 64


def test_hidden_states_match_transformers(checkpoint, enc32):
    ids = enc32.tokenizer.encode(TEXTS, enc32.max_length)
    lengths = [len(x) for x in ids]
    assert max(lengths) > 600 and 200 < sorted(lengths)[-3] and min(lengths) == 2
    _assert_parity(enc32.hidden_states(TEXTS), reference_hidden(checkpoint, ids, "sdpa"))


def test_hidden_states_match_transformers_eager(modernbert_dir):
    enc = load(modernbert_dir, device="cpu", dtype="float32")
    ids = enc.tokenizer.encode(TEXTS, enc.max_length)
    _assert_parity(enc.hidden_states(TEXTS), reference_hidden(modernbert_dir, ids, "eager"))


def _assert_parity(ours, ref):
    for text, a, b in zip(TEXTS, ours, ref):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() <= 1e-4, text[:30]


def test_single_token_sequence(checkpoint, enc32):
    ids = [[enc32.tokenizer.cls_id], enc32.tokenizer.encode(["def f(): pass"], None)[0]]
    packed = enc32.backbone(ids, None)
    ref = reference_hidden(checkpoint, ids)
    assert packed.shape[0] == 1 + len(ids[1])
    assert (packed[:1] - ref[0]).abs().max().item() <= 1e-4
    assert (packed[1:] - ref[1]).abs().max().item() <= 1e-4


def test_alone_equals_in_batch(enc32):
    batch = enc32.hidden_states(TEXTS)
    for i, text in enumerate(TEXTS):
        alone = enc32.hidden_states([text])[0]
        assert (alone - batch[i]).abs().max().item() <= 1e-5


def test_small_batches_equal_one_batch(enc32):
    one = enc32.hidden_states(TEXTS)
    many = enc32.hidden_states(TEXTS, batch_tokens=64)  # every text in its own pass
    for a, b in zip(one, many):
        assert (a - b).abs().max().item() <= 1e-5


def test_bfloat16_close_to_float32(checkpoint, enc32):
    # bf16 keeps 8 bits of mantissa; through 4 layers with a bf16 residual stream the hidden
    # states (LayerNorm output, entries of order 1) stay within 0.1 absolute and their
    # per-token cosine with fp32 above 0.999.
    enc16 = load(checkpoint, device="cpu", dtype="bfloat16")
    for a, b in zip(enc16.hidden_states(TEXTS), enc32.hidden_states(TEXTS)):
        assert (a - b).abs().max().item() <= 0.1
        assert torch.nn.functional.cosine_similarity(a, b, dim=1).min().item() >= 0.999


def test_truncation_keeps_final_sep(enc32):
    long_text = " ".join(CODE_CORPUS * 40)
    n = enc32.count_tokens([long_text])[0]
    ids = enc32.tokenizer.encode([long_text], 300)[0]
    assert n > 300 and len(ids) == 300
    assert ids[0] == enc32.tokenizer.cls_id and ids[-1] == enc32.tokenizer.sep_id
