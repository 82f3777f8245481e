"""Every noise draw in dpbudget goes through ``Sampler``: the source of random bits
(``dpbudget.mechanisms.bits.RandomBits``) is chosen in one place and handed to every mechanism.

Randomness is injected: ``Sampler(None)`` reads the operating system's CSPRNG (``os.urandom``);
``Sampler(numpy.random.Generator)`` or ``Sampler(seed)`` is reproducible and is for tests and
examples only, never for a real release.

A sampler handed to a mechanism is one-shot (``OneShotSampler``): the accountant gives each
release and each batch (``Sampler.once``), and each sparse-vector session (``Sampler.lease``), a
view of its source that stops working when that release returns (the session closes), so nothing a
mechanism keeps — the sampler, its ``bits`` — can draw noise for another request, such as one the
accountant refused (``SamplerSpentError``). It costs the release two small objects and one
indirection per draw of random words.

The mechanisms draw their noise from ``sampler.bits`` with the exact samplers (``dpbudget.mechanisms.exact``,
``dpbudget.mechanisms.grid``). The float methods below (inverse-CDF transforms of 64 random bits) remain only
for the explicit ``noise="float"`` opt-out: like every textbook implementation they are exposed to
the attacks on the set of reachable doubles (Mironov, CCS 2012; Jin et al., S&P 2022); see
docs/exact-noise.md.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidTypeError, SamplerSpentError
from dpbudget.mechanisms.bits import RandomBits

__all__ = ["OneShotSampler", "Sampler"]

_TWO_M53 = 2.0 ** -53
T = TypeVar("T")


# scipy.special.ndtri, imported on the first Gaussian draw rather than with this module: importing
# SciPy takes ~0.3 s, which every process would pay before its first (say Laplace) release. A
# module global, not an import in ``gaussian``, which would add ~0.2 µs to a 0.5 µs draw.
_ndtri: Any = None


def _load_ndtri() -> Any:
    global _ndtri
    from scipy.special import ndtri

    _ndtri = ndtri
    return ndtri


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
        generator: np.random.Generator | None
        if rng is None:
            generator = None
        elif isinstance(rng, np.random.Generator):
            generator = rng
        elif isinstance(rng, numbers.Integral) and not isinstance(rng, bool):
            if rng < 0:
                raise InvalidArgumentError("rng", rng, "a seed >= 0")
            generator = np.random.default_rng(int(rng))
        else:
            raise InvalidTypeError("rng", rng, "None (OS CSPRNG), a numpy.random.Generator or an "
                                   "int seed")
        self.bits = RandomBits(generator)

    @property
    def is_cryptographic(self) -> bool:
        """True when draws come from the operating system's CSPRNG."""
        return self.bits.is_cryptographic

    @property
    def source(self) -> str:
        """``"csprng"`` or ``"seeded"``: written into every release record."""
        return "csprng" if self.bits.is_cryptographic else "seeded"

    def _bits(self, size: int | tuple[int, ...] | None) -> Any:
        """64 random bits per draw: a Python ``int`` when ``size`` is None (the fast scalar path),
        else a ``uint64`` array of that shape. The transforms below accept either."""
        if size is None:
            return self.bits.word()
        n = math.prod((size,) if isinstance(size, int) else size)
        return self.bits.words(n).reshape(size)

    def one_shot(self) -> "OneShotSampler":
        """A sampler drawing from this one's source until its ``end()``, then never again."""
        return OneShotSampler(self.bits)

    def once(self, draw: Callable[[Any, "OneShotSampler"], T], value: Any) -> T:
        """``draw(value, sampler)`` with a one-shot sampler that ends when it returns (or raises):
        how the accountant hands its source to a release."""
        # (Built without __init__ calls and ended inline: this is on every release's path.)
        bits = _new(_OneShotBits)
        bits._source = self.bits
        sampler = _new(OneShotSampler)
        sampler.bits = bits
        try:
            return draw(value, sampler)
        finally:
            bits._source = _SPENT

    def lease(self, open_: Callable[["OneShotSampler"], T]) -> tuple["OneShotSampler", T]:
        """``open_(sampler)`` with a one-shot sampler that outlives it (a sparse-vector session's:
        ended when the session closes), ended at once if ``open_`` raises."""
        sampler = OneShotSampler(self.bits)
        try:
            return sampler, open_(sampler)
        except BaseException:
            sampler.end()
            raise

    def laplace(self, scale: float, size: int | tuple[int, ...] | None = None) -> Any:
        """Laplace(0, scale): sign from the lowest bit, magnitude −scale·ln U from the top 53."""
        bits = self._bits(size)
        return -scale * _log(_closed_unit(bits)) * (1.0 - 2.0 * (bits & 1))

    def gaussian(self, sigma: float, size: int | tuple[int, ...] | None = None) -> Any:
        """Normal(0, sigma²) by the inverse CDF; ``sigma`` is the standard deviation."""
        z = sigma * (_ndtri or _load_ndtri())(_open_unit(self._bits(size)))
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
        """A uniform integer in ``[0, n)``, exactly (``RandomBits.below``)."""
        return self.bits.below(n)

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


class OneShotSampler(Sampler):
    """A ``Sampler`` for one release: the accountant's source, until ``end()``.

    What ``draw`` (or a sparse-vector session) is handed. Once its release has returned (its
    session has closed) the accountant calls ``end()``: every later use of it or of its ``bits``
    raises ``SamplerSpentError`` and draws nothing. It cannot be copied or pickled (a copy would
    outlive ``end``).
    """

    def __init__(self, source: RandomBits) -> None:  # (not Sampler's: no source of its own)
        self.bits = _OneShotBits(source)

    def end(self) -> None:
        """Stop drawing: every later use raises ``SamplerSpentError``."""
        self.bits._source = _SPENT  # type: ignore[attr-defined]

    def __reduce__(self) -> Any:
        raise TypeError("a one-shot sampler cannot be copied or pickled")


class _OneShotBits(RandomBits):
    """A ``RandomBits`` that draws from ``_source`` until the one-shot sampler's ``end``."""

    __slots__ = ("_source",)

    def __init__(self, source: RandomBits) -> None:  # (no buffer or pool of its own)
        self._source: Any = source

    @property
    def is_cryptographic(self) -> bool:
        return bool(self._source.is_cryptographic)

    def word(self) -> int:
        return int(self._source.word())

    def words(self, n: int) -> Any:
        return self._source.words(n)

    def pooled(self, key: Any, refill: Any) -> Any:
        return self._source.pooled(key, refill)

    def pooled_many(self, key: Any, n: int, refill: Any) -> list[Any]:
        return list(self._source.pooled_many(key, n, refill))

    def below(self, m: int) -> int:
        return int(self._source.below(m))

    def below_array(self, m: int, n: int) -> Any:
        return self._source.below_array(m, n)

    def _half_words(self, n: int) -> Any:
        return self._source._half_words(n)

    def __reduce__(self) -> Any:
        raise TypeError("a one-shot sampler cannot be copied or pickled")


def _spent(*_: Any) -> Any:
    raise SamplerSpentError("this sampler was handed to a release that has returned (or a "
                            "session that has closed): it draws nothing more; a mechanism "
                            "draws only from the sampler its own draw is given")


class _Spent:
    """The source of a one-shot sampler after ``end``: every draw raises, drawing nothing. (Each
    method named, not ``__getattr__``: tools that probe attributes, such as doctest's finder,
    must get an ``AttributeError`` for names it does not have.)"""

    __slots__ = ()
    word = words = pooled = pooled_many = below = below_array = _half_words = staticmethod(_spent)
    is_cryptographic = property(_spent)


_SPENT = _Spent()
_new = object.__new__


def _closed_unit(bits: Any) -> Any:
    """Uniform on (0, 1] with 53-bit resolution, from the top 53 bits: (k + 1) 2^-53."""
    return ((bits >> 11) + 1.0) * _TWO_M53


def _open_unit(bits: Any) -> Any:
    """Uniform on (0, 1) with 52-bit resolution: (2k + 1) 2^-53, exactly representable."""
    return ((bits >> 12) * 2.0 + 1.0) * _TWO_M53


def _log(x: Any) -> Any:
    return math.log(x) if isinstance(x, float) else np.log(x)
