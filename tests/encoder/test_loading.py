"""Checkpoint resolution and validation: malformed files, the hub cache, offline mode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from codesearch.encoder import load
from codesearch.errors import BackendError, CheckpointError, ModelError

REPO = Path(__file__).resolve().parents[2]


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


# ---------------------------------------------------------------- malformed checkpoints


def test_missing_tensor_is_named(modernbert_dir, tmp_path):
    d = copy(modernbert_dir, tmp_path / "ckpt")
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["layers.2.mlp.Wi.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"no tensor 'layers\.2\.mlp\.Wi\.weight'"):
        load(d, device="cpu")


def test_wrong_shape_is_named(modernbert_dir, tmp_path):
    d = copy(modernbert_dir, tmp_path / "ckpt")
    tensors = load_file(str(d / "model.safetensors"))
    tensors["layers.1.attn.Wqkv.weight"] = tensors["layers.1.attn.Wqkv.weight"][:-1].contiguous()
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"'layers\.1\.attn\.Wqkv\.weight' has shape \(191, 64\)"):
        load(d, device="cpu")


def test_masked_lm_prefix_is_stripped_and_head_ignored(modernbert_dir, tmp_path):
    d = copy(modernbert_dir, tmp_path / "mlm")
    tensors = {f"model.{k}": v for k, v in load_file(str(d / "model.safetensors")).items()}
    tensors["head.dense.weight"] = tensors["model.final_norm.weight"].new_zeros(64, 64)
    tensors["decoder.bias"] = tensors["model.final_norm.weight"].new_zeros(10)
    save_file(tensors, str(d / "model.safetensors"))
    a = load(d, device="cpu", dtype="float32").hidden_states(["def f(): pass"])[0]
    b = load(modernbert_dir, device="cpu", dtype="float32").hidden_states(["def f(): pass"])[0]
    assert (a - b).abs().max().item() == 0


@pytest.mark.parametrize(
    "change,match",
    [
        ({"hidden_size": 62}, "not a multiple of num_attention_heads"),
        ({"num_hidden_layers": None}, "malformed value"),
        ({"layer_types": ["full_attention", "bogus", "sliding_attention", "full_attention"]}, "layer_types"),
        ({"hidden_activation": "swiglu_maybe"}, "hidden_activation 'swiglu_maybe'"),
        ({"vocab_size": 999}, r"'embeddings\.tok_embeddings\.weight' has shape"),
    ],
)
def test_bad_config(modernbert_dir, tmp_path, change, match):
    d = copy(modernbert_dir, tmp_path / "ckpt")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(change)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=match):
        load(d, device="cpu")


def test_missing_config_key_and_broken_json(modernbert_dir, tmp_path):
    d = copy(modernbert_dir, tmp_path / "ckpt")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["intermediate_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="no 'intermediate_size'"):
        load(d, device="cpu")
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load(d, device="cpu")


def test_missing_weights_file(modernbert_dir, tmp_path):
    d = copy(modernbert_dir, tmp_path / "ckpt")
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no model\.safetensors"):
        load(d, device="cpu")


def test_colbert_dense_shape_checked(colbert_dir, tmp_path):
    d = copy(colbert_dir, tmp_path / "cb")
    w = load_file(str(d / "1_Dense" / "model.safetensors"))["linear.weight"]
    save_file({"linear.weight": w[:, :10].contiguous()}, str(d / "1_Dense" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"'linear\.weight'"):
        load(d, device="cpu")


def test_colbert_dense_bin_fallback(colbert_dir, tmp_path):
    """Older PyLate checkpoints ship 1_Dense/pytorch_model.bin only: read with weights_only."""
    import torch

    d = copy(colbert_dir, tmp_path / "cb")
    w = load_file(str(d / "1_Dense" / "model.safetensors"))["linear.weight"]
    (d / "1_Dense" / "model.safetensors").unlink()
    torch.save({"linear.weight": w}, d / "1_Dense" / "pytorch_model.bin")
    a = load(d, device="cpu", dtype="float32").encode(["def f(): pass"])[0]
    b = load(colbert_dir, device="cpu", dtype="float32").encode(["def f(): pass"])[0]
    assert abs(a - b).max() == 0


def test_nonexistent_path(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load(str(tmp_path / "nope" / "model"), device="cpu")


# ---------------------------------------------------------------- devices and backends


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"backend": "flash"}, "flash"),
        ({"backend": "varlen"}, "varlen"),
        ({"backend": "nonsense"}, "nonsense"),
        ({"dtype": "float8"}, "float8"),
    ],
)
def test_explicit_impossible_runtime(modernbert_dir, kw, match):
    with pytest.raises(BackendError, match=match):
        load(modernbert_dir, device="cpu", **kw)


def test_cuda_requested_without_cuda(modernbert_dir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(BackendError, match="CUDA is not available"):
        load(modernbert_dir, device="cuda")


def test_identity_is_stable_and_follows_the_weights(modernbert_dir, tmp_path):
    from fixtures import models

    a = load(modernbert_dir, device="cpu").identity
    assert a == load(modernbert_dir, device="cpu").identity
    assert a.startswith(f"{modernbert_dir}@")
    other = models.make_modernbert(tmp_path / "other", seed=7)
    assert load(other, device="cpu").identity.split("@")[1] != a.split("@")[1]


# ---------------------------------------------------------------- hub: cache and offline


def test_offline_and_not_cached(tmp_path):
    code = (
        "from codesearch.encoder import load\n"
        "from codesearch.errors import ModelUnavailableError\n"
        "try:\n    load('lightonai/LateOn-Code-edge')\n"
        "except ModelUnavailableError as e:\n    print('ERR', e)\n"
    )
    r = run_python(code, {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        "ERR Model 'lightonai/LateOn-Code-edge' is not in the local cache and the hub cannot be "
        "reached; pass --model PATH to a local checkpoint or run 'codesearch models pull "
        "lightonai/LateOn-Code-edge' online"
    )


def test_cached_model_loads_offline(single_vector_dir, tmp_path):
    """A hub id found in the huggingface_hub cache layout loads without the network."""
    commit = "0" * 40
    repo = tmp_path / "hf" / "hub" / "models--tiny-org--tiny-model"
    shutil.copytree(single_vector_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    code = (
        "from codesearch.encoder import load, cached_models\n"
        "enc = load('tiny-org/tiny-model', device='cpu')\n"
        "print(enc.encode(['def f(): pass']).shape, enc.identity.split('@')[0])\n"
        "print([m.repo_id for m in cached_models()])\n"
    )
    r = run_python(code, {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["(1, 64) tiny-org/tiny-model", "['tiny-org/tiny-model']"]


def test_cached_models_empty_cache(tmp_path):
    r = run_python(
        "from codesearch.encoder import cached_models; print(cached_models())",
        {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty")},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_import_does_not_load_torch():
    r = run_python(
        "import sys, codesearch.encoder as e; e.DEFAULT_DENSE_MODEL; print('torch' in sys.modules)", {}
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_a_folder_that_is_no_checkpoint_says_so(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(CheckpointError, match="is not a model checkpoint folder"):
        load(str(tmp_path))


def test_a_cpu_load_does_not_import_the_compiler(colbert_dir):
    """torch._dynamo (and sympy) took 2.5 s of a 2.8 s CPU load of a 17M model: building on the
    meta device and the varlen module imported it. A CPU run never compiles; only CUDA may."""
    code = (
        "import sys; from codesearch.encoder import load; "
        f"enc = load({str(colbert_dir)!r}, device='cpu'); enc.encode(['def f(): pass']); "
        "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))"
    )
    done = run_python(code, {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
