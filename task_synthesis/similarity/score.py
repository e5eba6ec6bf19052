"""Similarity of two programs: the Dice coefficient of their bags of normalised-token n-grams.

sim(A, B) = 2 |A ∩ B| / (|A| + |B|) over multisets of n consecutive tokens (normalise.py). It is
1.0 for programs equal up to renaming and literal values, and falls as their structure and the
APIs they call diverge. An index keeps the bags of a set of programs for one-against-many queries.
"""

from __future__ import annotations

from collections import Counter

from .normalise import normalised_tokens

NGRAM = 4


def fingerprint(source: str, n: int = NGRAM) -> Counter:
    tokens = normalised_tokens(source)
    if len(tokens) < n:
        return Counter([tuple(tokens)])
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def dice(a: Counter, b: Counter) -> float:
    total = sum(a.values()) + sum(b.values())
    if total == 0:
        return 1.0
    shared = sum(min(count, b[gram]) for gram, count in a.items() if gram in b)
    return 2.0 * shared / total


def similarity(source_a: str, source_b: str) -> float:
    return dice(fingerprint(source_a), fingerprint(source_b))


class SimilarityIndex:
    """Fingerprints of named programs; `nearest` gives the most similar one to a new program."""

    def __init__(self):
        self.names: list[str] = []
        self.prints: list[Counter] = []
        self.sizes: list[int] = []

    def __len__(self) -> int:
        return len(self.names)

    def add(self, name: str, source_or_print) -> None:
        fp = source_or_print if isinstance(source_or_print, Counter) else fingerprint(source_or_print)
        self.names.append(name)
        self.prints.append(fp)
        self.sizes.append(sum(fp.values()))

    def nearest(self, fp: Counter, at_least: float = 0.0) -> tuple[float, str | None]:
        """(similarity, name) of the closest program; stops early at one reaching `at_least` (> 0)."""
        best, best_name = 0.0, None
        size = sum(fp.values())
        for name, other, other_size in zip(self.names, self.prints, self.sizes):
            if 2.0 * min(size, other_size) / max(1, size + other_size) <= best:
                continue  # even a full overlap could not beat the best so far
            score = dice(fp, other)
            if score > best:
                best, best_name = score, name
                if at_least and best >= at_least:
                    break
        return best, best_name
