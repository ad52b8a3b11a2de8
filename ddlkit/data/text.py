"""A synthetic review corpus whose labels can be learned, built offline and deterministically.

It is NOT a real review data set (no IMDB or similar text is reachable offline): every review
is drawn from fixed word lists, and its label is decided by its sentiment words, so a text
model can learn it and a learner can say why. Each review has ``length`` words: neutral filler
words, with ``cues`` sentiment words of its label's list (positive: label 1, negative: label 0)
put at random places, and one sentiment word of the other list (so a single word does not
decide it; the majority does)::

    texts, labels = reviews(2000, seed=0)
    ids, vocab = encode(texts)  # int32 (2000, length), 0 is padding, 1 is out-of-vocabulary

Generation is numpy only, and the same arguments always give the same corpus.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POSITIVE = (
    "good great excellent wonderful superb delightful brilliant enjoyable charming moving "
    "clever funny beautiful gripping touching fresh solid lovely stunning memorable"
).split()
NEGATIVE = (
    "bad awful terrible boring dull weak poor tedious clumsy bland messy silly painful "
    "forgettable annoying lazy flat predictable confusing disappointing"
).split()
NEUTRAL = (
    "the a this that film movie story plot actor actress scene scenes director script "
    "music camera ending start middle character characters cast screen show series episode "
    "season and but with was is were it its of in on at to for as by from very quite rather "
    "really just also again then when while after before one two some many every each "
    "time hour night day year people family friend city house road book song picture sound "
    "light dark old new long short first last other same own"
).split()

PAD, OOV = 0, 1  # the ids encode() gives padding and words outside its vocabulary


@dataclass(frozen=True)
class Corpus:
    """A corpus as token ids, ready for a model: what :func:`make` returns."""

    x_train: np.ndarray  # int32 (n_train, length)
    y_train: np.ndarray  # int32 (n_train,)
    x_test: np.ndarray
    y_test: np.ndarray
    vocab: tuple[str, ...]  # id i is vocab[i]; vocab[0] is padding, vocab[1] out-of-vocabulary

    def arrays(self) -> dict[str, np.ndarray]:
        """The four arrays by name, as ``np.savez`` takes them."""
        return {k: getattr(self, k) for k in ("x_train", "y_train", "x_test", "y_test")}


def reviews(
    n: int, *, length: int = 20, cues: int = 3, seed: int = 0
) -> tuple[list[str], np.ndarray]:
    """``n`` synthetic reviews (strings of ``length`` words) and their labels (int32, 0 or 1).

    Half the reviews (rounded down) are positive, in a shuffled order. A review of label 1
    holds ``cues`` positive words and one negative word, a review of label 0 the other way
    round; the rest are neutral words.
    """
    if n < 1 or cues < 2 or length < cues + 1:
        raise ValueError(
            f"reviews(n={n}, length={length}, cues={cues}): need n >= 1, cues >= 2 and "
            f"length >= cues + 1 (the review holds cues + 1 sentiment words). Fix: raise "
            "length or n, or lower cues"
        )
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) < n // 2).astype(np.int32)  # n // 2 ones
    pos, neg, neutral = (np.array(words, dtype=object) for words in (POSITIVE, NEGATIVE, NEUTRAL))
    texts = []
    for label in labels:
        words = neutral[rng.integers(len(neutral), size=length)]
        places = rng.permutation(length)[: cues + 1]
        mine, other = (pos, neg) if label == 1 else (neg, pos)
        words[places[:cues]] = mine[rng.integers(len(mine), size=cues)]
        words[places[cues]] = other[rng.integers(len(other))]
        texts.append(" ".join(words))
    return texts, labels


def vocabulary() -> tuple[str, ...]:
    """Every word :func:`reviews` can write, after the padding and out-of-vocabulary entries."""
    return ("", "[UNK]", *sorted(set(POSITIVE) | set(NEGATIVE) | set(NEUTRAL)))


def encode(texts: list[str], vocab: tuple[str, ...] | None = None) -> tuple[np.ndarray, tuple]:
    """Token ids (int32, one row per text, padded with 0 to the longest) and the vocabulary.

    The same ids as ``tf.keras.layers.TextVectorization(vocabulary=vocab[2:])`` gives these
    texts, without loading TensorFlow.
    """
    vocab = vocab or vocabulary()
    index = {word: i for i, word in enumerate(vocab) if i > OOV}
    rows = [[index.get(word, OOV) for word in text.split()] for text in texts]
    ids = np.full((len(rows), max(map(len, rows), default=0)), PAD, dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids, vocab


def make(
    n_train: int = 4000, n_test: int = 1000, *, length: int = 20, cues: int = 3, seed: int = 0
) -> Corpus:
    """A train and a test split (different seeds), encoded with :func:`vocabulary`."""
    train, y_train = reviews(n_train, length=length, cues=cues, seed=seed)
    test, y_test = reviews(n_test, length=length, cues=cues, seed=seed + 1)
    x_train, vocab = encode(train)
    x_test, _ = encode(test, vocab)
    return Corpus(x_train, y_train, x_test, y_test, vocab)
