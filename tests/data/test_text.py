"""The synthetic review corpus: deterministic, balanced, labels decided by its words."""

from __future__ import annotations

import numpy as np
import pytest

from ddlkit.data import text


def test_the_same_arguments_give_the_same_corpus_and_another_seed_another():
    a, la = text.reviews(50, seed=3)
    b, lb = text.reviews(50, seed=3)
    c, _ = text.reviews(50, seed=4)
    assert a == b and np.array_equal(la, lb)
    assert a != c


def test_half_the_reviews_are_positive_and_each_has_its_length():
    texts, labels = text.reviews(101, length=12, seed=0)
    assert labels.dtype == np.int32 and sorted(set(labels.tolist())) == [0, 1]
    assert int(labels.sum()) == 50
    assert all(len(t.split()) == 12 for t in texts)


def test_the_majority_of_sentiment_words_decides_the_label():
    texts, labels = text.reviews(300, cues=3, seed=1)
    pos, neg = set(text.POSITIVE), set(text.NEGATIVE)
    for words, label in zip(texts, labels, strict=True):
        n_pos = sum(w in pos for w in words.split())
        n_neg = sum(w in neg for w in words.split())
        assert (n_pos, n_neg) == ((3, 1) if label == 1 else (1, 3)), words
        assert not set(words.split()) - pos - neg - set(text.NEUTRAL)


def test_the_word_lists_do_not_overlap():
    pos, neg, neutral = set(text.POSITIVE), set(text.NEGATIVE), set(text.NEUTRAL)
    assert not (pos & neg) and not (pos & neutral) and not (neg & neutral)


def test_encode_pads_with_0_and_marks_unknown_words_1():
    ids, vocab = text.encode(["good film", "good zzz film"])
    good, film = vocab.index("good"), vocab.index("film")
    assert "zzz" not in vocab and vocab[:2] == ("", "[UNK]")
    assert ids.dtype == np.int32 and ids.tolist() == [[good, film, 0], [good, 1, film]]


def test_encode_gives_textvectorizations_ids():
    import os

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    texts, _ = text.reviews(20, seed=2)
    ids, vocab = text.encode(texts)
    layer = tf.keras.layers.TextVectorization(vocabulary=list(vocab[2:]))
    assert np.array_equal(layer(tf.constant(texts)).numpy(), ids)
    assert layer.get_vocabulary() == list(vocab)


def test_make_splits_and_encodes_with_one_vocabulary():
    corpus = text.make(n_train=40, n_test=10, length=8, seed=5)
    assert corpus.x_train.shape == (40, 8) and corpus.x_test.shape == (10, 8)
    assert corpus.y_train.shape == (40,) and corpus.y_test.shape == (10,)
    assert corpus.vocab == text.vocabulary()
    assert 1 < corpus.x_train.min() and corpus.x_train.max() < len(corpus.vocab)
    assert sorted(corpus.arrays()) == ["x_test", "x_train", "y_test", "y_train"]
    assert not np.array_equal(corpus.x_train[:10], corpus.x_test)


@pytest.mark.parametrize("kwargs", [{"n": 0}, {"n": 5, "cues": 1}, {"n": 5, "length": 3}])
def test_impossible_arguments_say_what_to_change(kwargs):
    n = kwargs.pop("n")
    with pytest.raises(ValueError, match="Fix:"):
        text.reviews(n, **kwargs)
