"""The sampler: one sequence's next token from its logits row, with a numpy Generator per
request, seeded when the request gives a seed, so that the same seed gives the same text
whatever else runs in the batch, and a preempted sequence continues with the same
generator (sampling.py checks the parameters it follows)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from .sampling import SamplingParams

# How many of the most likely tokens top_p looks among first (Sampler._nucleus).
_CANDIDATES = 512


class Sampler:
    """Picks one sequence's next token from its logits row."""

    __slots__ = ("params", "rng")

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def sample(self, logits: npt.NDArray[np.float32], banned: tuple[int, ...] = ()) -> int:
        """`banned`: tokens that may not come yet (EOS before min_tokens)."""
        params = self.params
        if banned:
            logits = logits.copy()
            logits[list(banned)] = -np.inf
        if params.greedy:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / params.temperature
        if params.min_p:
            # vLLM's order and rule: after the temperature, before top-k/top-p, a token
            # whose probability is below min_p times the most likely one's is dropped.
            floor = scaled.max() + math.log(params.min_p)
            scaled = np.where(scaled < floor, -np.inf, scaled)
        if 0 < params.top_k < scaled.shape[0]:
            kth = np.partition(scaled, -params.top_k)[-params.top_k]
            scaled = np.where(scaled < kth, -np.inf, scaled)
        scaled -= scaled.max()
        probs = np.exp(scaled)
        probs /= probs.sum()
        if params.top_p < 1.0:
            return self._nucleus(probs, params.top_p)
        cumulative = np.cumsum(probs)
        choice = int(np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right"))
        return min(choice, int(probs.shape[0]) - 1)

    def _nucleus(self, probs: npt.NDArray[np.float64], top_p: float) -> int:
        """Sample among the smallest set of most likely tokens whose mass reaches top_p.

        Sorting a whole vocabulary costs milliseconds a token; an LLM's distribution puts
        nearly all its mass on a few tokens, so the most likely `_CANDIDATES` are sorted
        alone when they hold top_p, which gives the same set; otherwise all are sorted."""
        candidates: npt.NDArray[np.intp] = np.arange(probs.shape[0])
        if probs.shape[0] > _CANDIDATES:
            top = np.argpartition(probs, -_CANDIDATES)[-_CANDIDATES:]
            if probs[top].sum() >= top_p:
                candidates = top
        order = candidates[np.argsort(-probs[candidates], kind="stable")]
        sorted_probs = probs[order]
        cumulative = np.cumsum(sorted_probs)
        keep = min(int(np.searchsorted(cumulative, top_p)) + 1, int(order.shape[0]))
        mass = cumulative[keep - 1]
        choice = int(np.searchsorted(cumulative[:keep], self.rng.random() * mass))
        return int(order[min(choice, keep - 1)])
