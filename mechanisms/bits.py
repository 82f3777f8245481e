"""The one source of random bits behind every noise draw: uniformly random 64-bit words.

``RandomBits(None)`` reads the operating system's CSPRNG (``os.urandom``); ``RandomBits(generator)``
reads a seeded ``numpy.random.Generator`` and is for tests and examples only. The exact samplers
(``dpbudget.mechanisms.exact``) turn these words into noise using integer comparisons only, so both sources
run the same algorithms on different bits.

Each source keeps a small buffer of words so that a scalar release does not pay a system call
(or a numpy call) per word. The buffer is emptied in a child process after ``fork`` (``os.register_at_fork``):
parent and child must never release noise built from the same words (for the OS source; a
seeded generator's child still continues the parent's sequence: seeded sources are for tests).
A copy or pickle of a source starts with an empty buffer and empty pools.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["RandomBits"]

_BUFFER_WORDS = 256
_LIVE: "weakref.WeakSet[RandomBits]" = weakref.WeakSet()


def _forget_after_fork() -> None:
    for source in list(_LIVE):
        source._buffer = []
        source._pools = {}


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork to guard against
    os.register_at_fork(after_in_child=_forget_after_fork)


class RandomBits:
    """Uniform random 64-bit words and exact uniform integers below any bound.

    Args:
        generator: ``None`` for the OS CSPRNG, else a seeded ``numpy.random.Generator``.

    Thread-safe: a word handed to one caller is never handed to another (``list.pop`` is atomic).
    """

    __slots__ = ("_generator", "_buffer", "_pools", "__weakref__")

    def __init__(self, generator: np.random.Generator | None) -> None:
        self._generator = generator
        self._buffer: list[int] = []
        self._pools: dict[Any, list[Any]] = {}
        _LIVE.add(self)

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy or a pickle (multiprocessing with spawn/forkserver) must never carry the buffered
        # words or pooled draws: two holders would release the same noise, and the difference of
        # their releases would be noise-free. A copy starts empty (and is fork-guarded).
        return (RandomBits, (self._generator,))

    @property
    def is_cryptographic(self) -> bool:
        return self._generator is None

    def word(self) -> int:
        """One uniformly random integer in [0, 2^64)."""
        try:
            return self._buffer.pop()
        except IndexError:
            self._buffer = self.words(_BUFFER_WORDS).tolist()
            return self.word()

    def pooled(self, key: Any, refill: Callable[[], list[Any]]) -> Any:
        """One draw from a pool of independent draws made ahead in bulk by ``refill`` (which must
        depend on public parameters only, named by ``key``). A scalar release then pays for a
        share of one bulk draw instead of a whole Python-level one. Pools are emptied after
        ``fork`` like the word buffer; each draw is handed out once (``list.pop``)."""
        pool = self._pools.get(key)
        if pool:
            try:
                return pool.pop()
            except IndexError:  # another thread took the last one
                pass
        if len(self._pools) > 64:  # many distinct parameters: stay bounded
            self._pools = {}
        self._pools[key] = pool = refill()
        return pool.pop()

    def pooled_many(self, key: Any, n: int, refill: Callable[[], list[Any]]) -> list[Any]:
        """``n`` draws from the pool ``key`` of :meth:`pooled`, in one call: a vector release of
        a few entries (DP-SGD's gradient) pays a share of bulk draws, not a bulk call's fixed cost.

        Why the law and the privacy are kept: the pool holds independent draws of one exact law,
        made from this source's words and never released before. Entries are taken by position
        (``list.pop``), never by value, so whatever decides how many are taken or when (the size
        of a release, other threads), the entries handed out are independent draws of that law,
        independent of every draw released before; each is handed out at most once (a draw lost
        to a race with another thread is dropped, never released twice).
        """
        pool = self._pools.get(key)
        if pool is not None and len(pool) >= n:
            try:
                return [pool.pop() for _ in range(n)]
            except IndexError:  # another thread emptied it meanwhile: the draws taken are dropped
                pass
        return [self.pooled(key, refill) for _ in range(n)]

    def words(self, n: int) -> Any:
        """``n`` uniformly random words as a ``uint64`` array."""
        if self._generator is not None:
            return self._generator.integers(0, 2 ** 64, size=n, dtype=np.uint64)
        return np.frombuffer(os.urandom(8 * n), dtype=np.uint64)

    def below(self, m: int) -> int:
        """A uniform integer in [0, m) for any integer m >= 1, exactly.

        Rejection sampling: take w = 64·⌈bitlength(m)/64⌉ random bits as an integer r and accept it
        when r < 2^w − (2^w mod m), so that every residue mod m is equally likely (``r % m`` alone
        would favour the small residues); the expected number of tries is below 2.
        """
        if m <= 1 << 64:
            limit = (1 << 64) - (1 << 64) % m
            while True:
                r = self.word()
                if r < limit:
                    return r % m
        chunks = (m.bit_length() + 63) // 64
        span = 1 << (64 * chunks)
        limit = span - span % m
        while True:
            r = 0
            for _ in range(chunks):
                r = (r << 64) | self.word()
            if r < limit:
                return r % m

    def below_array(self, m: int, n: int) -> Any:
        """``n`` uniform integers in [0, m), exactly, as an ``int64`` array; 1 <= m <= 2^63."""
        # Half-words when m fits in 32 bits: the OS CSPRNG's bytes are most of the samplers' cost.
        width, words = (32, self._half_words) if m <= 1 << 32 else (64, self.words)
        dtype = np.uint32 if width == 32 else np.uint64
        limit = (1 << width) - (1 << width) % m
        out = np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        modulus = dtype(m % (1 << width)) if m < 1 << width else None
        while todo.size:
            r = words(todo.size)
            if modulus is None:  # m = 2^width: every word is accepted as it is
                out[todo] = r.astype(np.int64) if width == 32 else r.view(np.int64)
                break
            ok = r < dtype(limit) if limit < 1 << width else np.ones(todo.size, dtype=bool)
            out[todo[ok]] = (r[ok] % modulus).astype(np.int64)
            todo = todo[~ok]
        return out

    def _half_words(self, n: int) -> Any:
        if self._generator is not None:
            return self._generator.integers(0, 2 ** 32, size=n, dtype=np.uint32)
        return np.frombuffer(os.urandom(4 * n), dtype=np.uint32)
