"""The grammar mask of structured outputs (backends/llm/structured.py): whatever the
logits favour, the sampler never gets a token the grammar does not allow."""

from __future__ import annotations

import json
from pathlib import Path

import llmrepo
import numpy as np
import pytest

from ge_serve.backends.llm.sampler import Sampler
from ge_serve.backends.llm.sampling import SamplingError, SamplingParams, sampling_params
from ge_serve.backends.llm.settings import SamplingDefaults
from ge_serve.backends.llm.structured import GrammarFailed, Grammars, Structured
from ge_serve.backends.llm.text import Tokenizer

EOS = 256
# The graph's vocabulary is larger than the tokenizer's 257 tokens (VOCAB 320), and the
# mask here larger still, to show that rows past the tokenizer's are never allowed.
GRAPH_VOCAB = 400


@pytest.fixture(scope="module")
def grammars(tmp_path_factory: pytest.TempPathFactory) -> Grammars:
    path: Path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    llmrepo.byte_tokenizer().save(str(path))
    return Grammars(Tokenizer(path), GRAPH_VOCAB, frozenset({EOS}))


def allowed_ids(row: np.ndarray) -> set[int]:
    return {int(i) for i in np.flatnonzero(np.isfinite(row))}


def test_disallowed_tokens_never_pass_whatever_the_logits(grammars: Grammars) -> None:
    a, b = llmrepo.prompt_ids("ab")
    constraint = grammars.constraint(Structured("choice", '["ab"]'))
    greedy = Sampler(SamplingParams(None, temperature=0))
    logits = np.zeros(GRAPH_VOCAB, dtype=np.float32)
    logits[[EOS, 300, 399, b]] = 1e9  # the EOS, unused rows, the wrong letter
    row = constraint.allowed(logits)
    assert row is not None and allowed_ids(row) == {a}
    assert logits[300] == 1e9  # the row given is left as it was
    token = greedy.sample(row)
    assert token == a
    constraint.accept(token)
    # Random sampling at a high temperature, where every logit but one favours others.
    random = Sampler(SamplingParams(None, temperature=100.0, seed=1))
    row = constraint.allowed(logits)
    assert row is not None and allowed_ids(row) == {b}
    assert all(random.sample(row) == b for _ in range(50))
    constraint.accept(b)
    # Complete: the EOS alone; banned (min_tokens), nothing is left.
    row = constraint.allowed(logits)
    assert row is not None and allowed_ids(row) == {EOS}
    assert constraint.allowed(logits, banned=(EOS,)) is None


def test_a_rejected_token_is_an_error(grammars: Grammars) -> None:
    constraint = grammars.constraint(Structured("regex", "[0-9]+"))
    with pytest.raises(GrammarFailed, match="the grammar cannot go on") as caught:
        constraint.accept(llmrepo.prompt_ids("x")[0])
    assert len(str(caught.value)) < 400


def test_bad_grammars_say_what_is_wrong(grammars: Grammars) -> None:
    with pytest.raises(ValueError, match=r"^Grammar error: .*regex"):
        grammars.constraint(Structured("regex", "(["))
    with pytest.raises(ValueError, match=r"^Grammar error: "):
        grammars.constraint(Structured("grammar", "start: undefined_rule"))


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"json": {}, "regex": "a"}, "You can only use one kind"),
        ({}, "You must use one kind"),
        ({"json_object": False}, "json_object must be True if set"),
        ({"grammar": "  "}, "grammar cannot be an empty string"),
        ({"json": ""}, "json cannot be an empty string"),
        ({"regex": "a\x00"}, "must not contain a NUL"),
        ({"choice": "a"}, "must be a list of strings"),
        ({"regex": "a", "disable_any_whitespace": "yes"}, "must be true or false"),
        ({"structural_tag": '{"triggers": []}'}, "No structural tags found in the grammar spec"),
        ({"structural_tag": {"format": {"type": "any_text", "max_tokens": 8}}}, "max_tokens"),
        (
            {"structural_tag": {"triggers": ["<f"], "structures": [{"begin": "<g>", "end": "/"}]}},
            r"Trigger <g> not found in triggers \['<f'\]",
        ),
        ({"structural_tag": {"triggers": ["<f"], "structures": [{"begin": "<f>"}]}}, "'end'"),
        ([1], "must be an object"),
    ],
)
def test_the_key_is_checked_in_vllms_words(value: object, words: str) -> None:
    with pytest.raises(SamplingError, match=words):
        sampling_params(
            SamplingDefaults(16, 1.0, 1.0, 0), {"structured_outputs": value}, None, None
        )


def test_a_structural_tag_forces_its_structure_after_a_trigger(grammars: Grammars) -> None:
    """vLLM's legacy structural tag: text is free until the model writes a trigger; then
    the structure's begin, a JSON value of its schema and its end are forced, and the text
    is free again, for as many tags as the model writes."""
    tag = {
        "triggers": ["<f="],
        "structures": [{"begin": "<f=n>", "schema": {"type": "integer"}, "end": "</f>"}],
    }
    constraint = grammars.constraint(
        Structured("structural_tag", json.dumps(tag, separators=(",", ":")))
    )
    logits = np.zeros(GRAPH_VOCAB, dtype=np.float32)

    def ids(text: str) -> set[int]:
        return set(llmrepo.prompt_ids(text))

    def write(text: str) -> set[int]:
        for token in llmrepo.prompt_ids(text):
            row = constraint.allowed(logits)
            assert row is not None and token in allowed_ids(row), text
            constraint.accept(token)
        row = constraint.allowed(logits)
        assert row is not None
        return allowed_ids(row)

    assert ids("x<Z") <= write("Hello ")  # free text: any byte
    assert write("<f=") == ids("n")  # the trigger: the begin's rest is forced
    assert ids("-0123456789") <= write("n>") <= ids("-0123456789 \n\t\r")  # an integer
    assert ids("<") <= write("42") <= ids("0123456789 \n\t<")
    assert write("</f>") >= ids("x<") | {EOS}  # free again


def test_a_graph_vocabulary_smaller_than_the_tokenizers_still_masks(tmp_path: Path) -> None:
    """vLLM's rule: the grammar covers the larger of the two vocabularies (llguidance
    refuses one smaller than its tokenizer's); the row is the graph's."""
    path = tmp_path / "tokenizer.json"
    llmrepo.byte_tokenizer().save(str(path))
    small = Grammars(Tokenizer(path), 200, frozenset({EOS}))
    (a,) = llmrepo.prompt_ids("a")
    constraint = small.constraint(Structured("regex", "a"))
    row = constraint.allowed(np.zeros(200, dtype=np.float32))
    assert row is not None and row.shape == (200,) and allowed_ids(row) == {a}


def test_bad_words_are_bounded_before_they_are_tokenized() -> None:
    defaults = SamplingDefaults(16, 1.0, 1.0, 0)
    with pytest.raises(SamplingError, match="at most 65536 bytes"):
        sampling_params(
            defaults, {}, json.dumps({"bad_words": ["hello world " * 6000]}).encode(), None
        )
