"""Every noise draw in dpbudget goes through ``Sampler``, so that the source of randomness and the
sampling algorithms can be replaced in one place (exact integer samplers are planned here).

Randomness is injected: ``Sampler(None)`` reads the operating system's CSPRNG (``os.urandom``);
``Sampler(numpy.random.Generator)`` or ``Sampler(seed)`` is reproducible and is for tests and
examples only, never for a real release.

All distributions are built from 64 random bits per draw by inverse-CDF transforms, the same way for
both sources. These are floating-point samplers: like every textbook implementation they are exposed
to the attacks on the set of reachable doubles (Mironov, CCS 2012; Jin et al., S&P 2022); see
docs/theory.md §4.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
from scipy.special import ndtri

from accountant.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["Sampler"]

_TWO_M53 = 2.0 ** -53


class Sampler:
    """Draws noise from an injected source of random bits.

    Args:
        rng: ``None`` for the OS CSPRNG (the default), a ``numpy.random.Generator``, or an ``int``
            seed (reproducible; tests and examples only).

    >>> s = Sampler(7)
    >>> abs(s.laplace(1.0)) < 40
    True
    >>> s.gaussian(2.0, size=3).shape
    (3,)
    """

    def __init__(self, rng: Any = None) -> None:
        if rng is None:
            self._generator = None
        elif isinstance(rng, np.random.Generator):
            self._generator = rng
        elif isinstance(rng, numbers.Integral) and not isinstance(rng, bool):
            if rng < 0:
                raise InvalidArgumentError("rng", rng, "a seed >= 0")
            self._generator = np.random.default_rng(int(rng))
        else:
            raise InvalidTypeError("rng", rng, "None (OS CSPRNG), a numpy.random.Generator or an "
                                   "int seed")

    @property
    def is_cryptographic(self) -> bool:
        """True when draws come from the operating system's CSPRNG."""
        return self._generator is None

    def _bits(self, size: int | tuple[int, ...] | None) -> Any:
        """64 random bits per draw: a Python ``int`` when ``size`` is None (the fast scalar path),
        else a ``uint64`` array of that shape. The transforms below accept either."""
        if size is None:
            if self._generator is None:
                return int.from_bytes(os.urandom(8), "little")
            return int(self._generator.integers(0, 2 ** 64, dtype=np.uint64))
        n = math.prod((size,) if isinstance(size, int) else size)
        if self._generator is None:
            raw = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
        else:
            raw = self._generator.integers(0, 2 ** 64, size=n, dtype=np.uint64)
        return raw.reshape(size)

    def laplace(self, scale: float, size: int | tuple[int, ...] | None = None) -> Any:
        """Laplace(0, scale): sign from the lowest bit, magnitude −scale·ln U from the top 53."""
        bits = self._bits(size)
        return -scale * _log(_closed_unit(bits)) * (1.0 - 2.0 * (bits & 1))

    def gaussian(self, sigma: float, size: int | tuple[int, ...] | None = None) -> Any:
        """Normal(0, sigma²) by the inverse CDF; ``sigma`` is the standard deviation."""
        z = sigma * ndtri(_open_unit(self._bits(size)))
        return float(z) if size is None else z

    def exponential(self, scale: float, size: int | tuple[int, ...] | None = None) -> Any:
        """Exponential with mean ``scale``: −scale·ln U."""
        return -scale * _log(_closed_unit(self._bits(size)))

    def gumbel(self, scale: float, size: int | tuple[int, ...] | None = None) -> Any:
        """Gumbel(0, scale): −scale·ln(−ln U)."""
        return -scale * _log(-_log(_open_unit(self._bits(size))))

    def uniform(self, size: int | tuple[int, ...] | None = None) -> Any:
        """Uniform on (0, 1)."""
        return _open_unit(self._bits(size))

    def index(self, n: int) -> int:
        """A uniform integer in ``[0, n)``, exactly: rejection sampling on 64 random bits, so no
        residue class is favoured (``bits % n`` alone would be biased when n does not divide 2^64).
        """
        accept = 2 ** 64 - 2 ** 64 % n
        while True:
            bits = int(self._bits(None))
            if bits < accept:
                return bits % n

    def laplace_stream(self, scale: float) -> Iterator[float]:
        """An endless stream of independent Laplace(0, scale) Python floats, drawn in blocks.

        The same draws as :meth:`laplace`, fetched a block at a time (16, doubling to 4096) so that
        a caller asking for one number per step (a sparse-vector session) pays a generator step,
        not a numpy call. Draws are made ahead of use; they depend on nothing but ``scale``.
        """
        block = 16
        while True:
            yield from self.laplace(scale, size=block).tolist()
            block = min(2 * block, 4096)


def _closed_unit(bits: Any) -> Any:
    """Uniform on (0, 1] with 53-bit resolution, from the top 53 bits: (k + 1) 2^-53."""
    return ((bits >> 11) + 1.0) * _TWO_M53


def _open_unit(bits: Any) -> Any:
    """Uniform on (0, 1) with 52-bit resolution: (2k + 1) 2^-53, exactly representable."""
    return ((bits >> 12) * 2.0 + 1.0) * _TWO_M53


def _log(x: Any) -> Any:
    return math.log(x) if isinstance(x, float) else np.log(x)
