"""Philox-4x32-10 and the draws (reference/README.md "Randomness"), vectorised over uint64 NumPy
arrays: the FNV-1a stream hash, the counter-based Philox block, RngStream (uniform, normal,
below keyed by seed, name, step and element index) and element-wise libm calls, bitwise the C++
oracle's."""

import math

import numpy as np

_MASK = np.uint64(0xFFFFFFFF)
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_SHIFT32, _SHIFT11 = np.uint64(32), np.uint64(11)
_TWO_M53 = 2.0**-53


def fnv1a32(name):
    """The stream hash: FNV-1a, 32 bits, over the name's UTF-8 bytes."""
    h = 2166136261
    for b in name.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Random123's philox4x32 with 10 rounds on arrays of 32-bit words (any integer arrays that
    broadcast together; the key words are Python ints). Returns the four output words as uint64
    arrays holding 32-bit values."""
    c0, c1, c2, c3 = np.broadcast_arrays(*(np.asarray(c, dtype=np.uint64) & _MASK
                                           for c in (c0, c1, c2, c3)))
    k0, k1 = int(k0) & 0xFFFFFFFF, int(k1) & 0xFFFFFFFF
    for r in range(10):
        if r:
            k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
        p0 = _M0 * c0  # < 2^64: 32 x 32 bits
        p1 = _M1 * c2
        c0, c1, c2, c3 = ((p1 >> _SHIFT32) ^ c1 ^ np.uint64(k0), p1 & _MASK,
                          (p0 >> _SHIFT32) ^ c3 ^ np.uint64(k1), p0 & _MASK)
    return c0, c1, c2, c3


def _libm(fn, x):
    """fn (math.log, math.cos) element by element: the C library's results, as the C++ gets them
    (NumPy's vectorised transcendental functions may differ from it in the last bit)."""
    flat = np.ascontiguousarray(x, dtype=np.float64).ravel()
    return np.fromiter((fn(v) for v in flat.tolist()), np.float64, flat.size).reshape(np.shape(x))


class RngStream:
    """RngStream::of(seed, name, step): draws keyed by (seed, name, step, element index)."""

    def __init__(self, seed, name, step=0):
        self.seed, self.name, self.step = int(seed), name, int(step)
        self.key = (self.seed & 0xFFFFFFFF, self.seed >> 32)
        self.hash = fnv1a32(name)

    def block(self, index):
        i = np.asarray(index, dtype=np.uint64)
        return philox4x32_10(i & _MASK, i >> _SHIFT32, self.step, self.hash, *self.key)

    def bits(self, index):
        """(w0 << 32 | w1): the 64 bits uniform and below use."""
        w0, w1, _, _ = self.block(index)
        return (w0 << _SHIFT32) | w1

    def uniform(self, index):
        """Doubles in [0, 1): the top 53 bits of (w0 << 32 | w1), times 2^-53."""
        return (self.bits(index) >> _SHIFT11).astype(np.float64) * _TWO_M53

    def normal(self, index):
        """Box-Muller on the block's two 64-bit halves (bitwise the C++: libm log and cos)."""
        w0, w1, w2, w3 = self.block(index)
        u1 = (((w0 << _SHIFT32 | w1) >> _SHIFT11) + np.uint64(1)).astype(np.float64) * _TWO_M53
        u2 = ((w2 << _SHIFT32 | w3) >> _SHIFT11).astype(np.float64) * _TWO_M53
        return np.sqrt(-2.0 * _libm(math.log, u1)) * _libm(math.cos, 2.0 * math.pi * u2)

    def below(self, index, n):
        """(w0 << 32 | w1) mod n (n a positive integer or an array of them)."""
        return self.bits(index) % np.asarray(n, dtype=np.uint64)
