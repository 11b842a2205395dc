#!/usr/bin/env python3
"""Embed sentences with the `minilm` ensemble and print their cosine similarities.

The server tokenizes (Python model), encodes (all-MiniLM-L6-v2 on the GE backend) and
mean-pools; the client only sends strings and gets unit-length FP32 [384] embeddings back,
so a cosine similarity is a dot product. Build and serve the repository first:

    python3 examples/minilm/build.py --out /tmp/minilm-models
    ge-serve --model-repository /tmp/minilm-models
    python3 examples/clients/minilm_similarity.py --url localhost:8000
    python3 examples/clients/minilm_similarity.py --protocol grpc --url localhost:8001 \\
        "A man is eating food." "A man is eating a meal." "The girl is carrying a baby."

With no sentences it embeds a fixed set and checks that each sentence's paraphrase is
closer to it than the unrelated sentences are (PASS or FAIL on the last line).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

MODEL = "minilm"
MAX_BATCH = 8  # the pipeline's max_batch_size
# Pairs of paraphrases: sentences 2k and 2k+1 say the same thing.
DEFAULT_SENTENCES = (
    "A man is playing a guitar.",
    "Someone is playing an instrument.",
    "How do I reset my password?",
    "I forgot my password and need to change it.",
    "The cat sleeps on the sofa.",
    "A kitten is napping on the couch.",
)


def embed(client: Any, module: Any, sentences: list[str]) -> npt.NDArray[np.float32]:
    """EMBEDDING [n, 384] for n sentences, in requests of at most MAX_BATCH rows."""
    rows = []
    for start in range(0, len(sentences), MAX_BATCH):
        chunk = sentences[start : start + MAX_BATCH]
        text = np.array([[s.encode("utf-8")] for s in chunk], dtype=np.object_)
        tensor = module.InferInput("TEXT", list(text.shape), "BYTES")
        tensor.set_data_from_numpy(text)
        result = client.infer(MODEL, [tensor])
        rows.append(result.as_numpy("EMBEDDING"))
    embeddings: npt.NDArray[np.float32] = np.concatenate(rows)
    return embeddings


def paraphrases_rank_first(similarity: npt.NDArray[np.float32]) -> bool:
    """Each default sentence's nearest other sentence is its paraphrase."""
    others = similarity - 2 * np.eye(len(similarity))
    nearest = others.argmax(axis=1)
    return all(int(nearest[i]) == i ^ 1 for i in range(len(similarity)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("sentences", nargs="*", help="sentences to compare (default: a fixed set)")
    parser.add_argument("-u", "--url", default="localhost:8000", help="host:port, no scheme")
    parser.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http")
    args = parser.parse_args()

    sentences = list(args.sentences or DEFAULT_SENTENCES)
    module: Any = httpclient if args.protocol == "http" else grpcclient
    client = module.InferenceServerClient(url=args.url)
    try:
        embeddings = embed(client, module, sentences)
    finally:
        client.close()

    similarity = embeddings @ embeddings.T
    print(f"{len(sentences)} embeddings of {embeddings.shape[1]} dims; cosine similarity:")
    for i, sentence in enumerate(sentences):
        print(f"  [{i}] {sentence}")
    print("      " + "".join(f"{f'[{j}]':>8}" for j in range(len(sentences))))
    for i, row in enumerate(similarity):
        print(f"  [{i}] " + "".join(f"{value:8.4f}" for value in row))

    unit = bool(np.allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-4))
    ok = unit and (bool(args.sentences) or paraphrases_rank_first(similarity))
    print(f"PASS: minilm_similarity ({args.protocol})" if ok else "FAIL: minilm_similarity")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
