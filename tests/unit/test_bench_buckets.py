"""The buckets bench suite: its configs parse, and its stand-in encoder ignores padding."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
from google.protobuf import text_format

from bench.suites import buckets
from ge_serve.protos import model_config_pb2


def test_the_configs_parse_and_name_their_shapes() -> None:
    for backend in ("npu_ge", "onnxruntime"):
        for padded in (False, True):
            text = buckets.config_text(backend, 4, [32, 64], padded)
            config = text_format.Parse(text, model_config_pb2.ModelConfig())
            params = {k: v.string_value for k, v in config.parameters.items()}
            if backend == "npu_ge" and not padded:
                # Every length: a shape range over them, any batch up to the maximum.
                assert params["graph.ge.inputShape"] == (
                    "input_ids:1~4,32~64;attention_mask:1~4,32~64"
                )
                assert "graph.ge.dynamicDims" not in params
            elif backend == "npu_ge":
                gears = params["graph.ge.dynamicDims"].split(";")
                assert gears == ["1,32,1,32", "1,64,1,64", "2,32,2,32", "2,64,2,64",
                                 "4,32,4,32", "4,64,4,64"]  # fmt: skip
            else:
                assert ("bucket_sizes" in params) is padded


def test_the_default_lengths_spread_evenly_and_one_client_each() -> None:
    lengths = buckets.spread(32)
    assert len(lengths) == 32 and lengths[0] == 16 and lengths[-1] == 128
    steps = {b - a for a, b in itertools.pairwise(lengths)}
    assert steps <= {3, 4}


def test_the_stand_in_gives_the_same_embedding_padded_or_not() -> None:
    session = ort.InferenceSession(buckets.build_model(layers=1).SerializeToString())
    sample = buckets.sample(20, seed=1)
    (plain,) = session.run(None, sample)
    padded = {k: np.pad(v, ((0, 0), (0, 12))) for k, v in sample.items()}
    (bucketed,) = session.run(None, padded)
    assert plain.shape == (1, buckets.HIDDEN)
    np.testing.assert_allclose(plain, bucketed, rtol=1e-5, atol=1e-6)
