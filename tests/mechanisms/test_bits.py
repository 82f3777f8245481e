"""The one source of random bits (``mechanisms.bits.RandomBits``): a seeded source repeats and the
OS source does not, ``below`` is uniform, pooled draws are handed out once each, and neither a
forked child nor a copy or pickle ever reuses the words or draws of the source it came from."""

from __future__ import annotations

import numpy as np

from dpbudget.mechanisms import exact
from dpbudget.mechanisms.bits import RandomBits
from tests.mechanisms.stat_checks import ALPHA


def test_seeded_draws_repeat_and_the_os_source_does_not() -> None:
    a = exact.discrete_laplace_array(RandomBits(np.random.default_rng(3)), 1, 5, 100)
    b = exact.discrete_laplace_array(RandomBits(np.random.default_rng(3)), 1, 5, 100)
    assert (a == b).all()
    c = exact.discrete_laplace_array(RandomBits(None), 1, 5, 100)
    d = exact.discrete_laplace_array(RandomBits(None), 1, 5, 100)
    assert not (c == d).all()


def test_below_is_uniform_and_rejects_the_biased_top() -> None:
    """A word at or above 2^64 − (2^64 mod m) is rejected (it would favour small residues)."""
    class Words(RandomBits):
        __slots__ = ("seq",)

        def word(self) -> int:
            return self.seq.pop(0)

    m = 3
    limit = (1 << 64) - (1 << 64) % m
    w = Words(np.random.default_rng(0))
    w.seq = [limit, (1 << 64) - 1, 7]
    assert w.below(m) == 7 % m and w.seq == []
    big = (1 << 70) + 3  # several words per draw
    draws = [RandomBits(None).below(big) for _ in range(200)]
    assert all(0 <= x < big for x in draws) and max(draws) > big // 2
    arr = RandomBits(np.random.default_rng(1)).below_array(6, 60_000)
    assert stats_uniform_ok(np.bincount(arr, minlength=6))


def test_fork_child_does_not_reuse_the_parents_buffered_words() -> None:
    import os
    bits = RandomBits(None)
    bits.word()  # fills the buffer
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, bits.word().to_bytes(8, "little"))
        os._exit(0)
    os.waitpid(pid, 0)
    child = int.from_bytes(os.read(read, 8), "little")
    assert child != bits.word()  # the parent's next buffered word is not the child's


def test_fork_child_does_not_reuse_the_parents_pooled_draws() -> None:
    """Scalar releases draw from a pool made ahead; a forked child must not release the parent's
    next draws (same pid-independent pool, same noise: the two releases would cancel)."""
    import os
    bits = RandomBits(None)
    refill = lambda: list(range(1000))  # noqa: E731 - a recognisable pool
    bits.pooled("k", refill)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, str(bits.pooled("k", lambda: [-1])).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"-1"  # the child refilled; it never saw the parent's pool
    assert bits.pooled("k", refill) == 998


def test_a_copied_or_pickled_source_never_repeats_the_originals_noise() -> None:
    import copy
    import pickle
    bits = RandomBits(None)
    bits.word()
    bits.pooled("k", lambda: list(range(100)))
    for clone in (copy.copy(bits), copy.deepcopy(bits), pickle.loads(pickle.dumps(bits))):
        assert clone._buffer == [] and clone._pools == {} and clone.is_cryptographic
        assert clone.word() != bits.word()


def test_pooled_many_hands_each_draw_out_once_in_pool_order() -> None:
    """Entries are taken by position, each once: across refills, the draws handed out are the
    pools' entries in pop order, with no repeat and none skipped."""
    bits = RandomBits(None)
    pools = iter([list(range(0, 100)), list(range(100, 200)), list(range(200, 300))])
    taken = [bits.pooled_many("k", 31, lambda: next(pools)) for _ in range(9)]
    flat = [x for part in taken for x in part]
    assert all(len(part) == 31 for part in taken) and len(set(flat)) == len(flat) == 279
    assert flat[:100] == list(range(99, -1, -1))  # the first pool, popped from its end
    assert sorted(flat[100:200]) == list(range(100, 200))


def test_fork_child_does_not_reuse_the_parents_pooled_vector_draws() -> None:
    """As for scalar draws: a forked child refills, never taking the parent's next entries."""
    import os
    bits = RandomBits(None)
    bits.pooled_many("v", 3, lambda: list(range(1000)))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, str(bits.pooled_many("v", 3, lambda: [-1, -2, -3])).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 64) == b"[-3, -2, -1]"  # the child refilled from its own draws
    assert bits.pooled_many("v", 3, lambda: [-1, -2, -3]) == [996, 995, 994]


def stats_uniform_ok(counts: np.ndarray) -> bool:
    from scipy import stats
    return bool(stats.chisquare(counts).pvalue > ALPHA)
