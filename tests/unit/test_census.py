"""The batcher's census of who can join a batch: per key, samples in the server and the
clients of that key seen (scheduler/census.py)."""

from __future__ import annotations

from ge_serve.scheduler.census import MAX_KEYS, ShapeCensus


def test_a_key_s_clients_are_unknown_until_one_of_its_batches_leaves() -> None:
    census = ShapeCensus()
    census.arrived("len16", 1)
    census.arrived("len16", 1)
    assert census.outside("len16") == -1
    census.left("len16", 2)
    assert census.outside("len16") == 2
    census.arrived("len16", 1)
    assert census.outside("len16") == 1


def test_one_client_per_length_leaves_no_one_to_wait_for() -> None:
    census = ShapeCensus()
    for key in ("len16", "len20", "len24"):
        census.arrived(key, 1)
    for key in ("len16", "len20", "len24"):
        census.left(key, 1)
        census.arrived(key, 1)
        # Its only client is back: nothing more of this length can come.
        assert census.outside(key) == 0
    assert census.outside("len28") == -1


def test_a_client_outside_when_its_key_leaves_is_kept_one_gone_is_forgotten() -> None:
    census = ShapeCensus()
    census.arrived("k", 4)
    census.left("k", 4)
    census.arrived("k", 3)
    census.left("k", 3)  # one was outside: still counted
    census.arrived("k", 3)
    assert census.outside("k") == 1
    for _ in range(3):  # it never comes back
        census.left("k", 3)
        census.arrived("k", 3)
    assert census.outside("k") == 0


def test_keys_with_nothing_in_the_server_are_not_kept_without_bound() -> None:
    census = ShapeCensus()
    for index in range(3 * MAX_KEYS):
        census.arrived(index, 1)
        census.left(index, 1)
    assert sum(census.outside(index) >= 0 for index in range(3 * MAX_KEYS)) <= MAX_KEYS + 1


def test_past_the_bound_the_keys_in_use_keep_their_clients() -> None:
    census = ShapeCensus()
    for index in range(MAX_KEYS + 1):
        census.arrived(index, 1)
        census.left(index, 1)
    for _ in range(10):
        census.arrived("hot", 4)
        census.left("hot", 4)
    assert census.outside("hot") == 4
    assert census.outside(0) == -1  # the longest unused key was forgotten instead
