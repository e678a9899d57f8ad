"""The counter-based generator fixture scripts draw random weights and inputs from, so that a C++ test
(tests/model/counter_rng.h) makes the same values bit for bit: element i of the stream `name` is
splitmix64(fnv1a64(name) ^ seed + i); unif and sym are exact in fp32."""
import numpy as np

M64 = (1 << 64) - 1


def fnv1a(name: str) -> int:
    h = 0xCBF29CE484222325
    for ch in name.encode():
        h = ((h ^ ch) * 0x100000001B3) & M64
    return h


def stream(seed: int, name: str, start: int, n: int) -> np.ndarray:
    """splitmix64(key + i) for start <= i < start + n, key = fnv1a64(name) ^ seed."""
    with np.errstate(over="ignore"):
        z = (np.uint64((fnv1a(name) ^ seed) & M64) + np.arange(start, start + n, dtype=np.uint64) +
             np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def unif(seed: int, name: str, n: int) -> np.ndarray:
    """Uniform in (0, 1), exact in fp32: (2 * (x >> 41) + 1) * 2^-24, an odd 24-bit numerator (made in chunks:
    full-size tables are large)."""
    out = np.empty(n, np.float32)
    for at in range(0, n, 1 << 23):
        x = stream(seed, name, at, min(n - at, 1 << 23))
        out[at:at + len(x)] = ((x >> np.uint64(41)) * np.uint64(2) + np.uint64(1)).astype(np.float32)
    return out * np.float32(2.0 ** -24)


def sym(seed: int, name: str, n: int, amp: float) -> np.ndarray:
    """Uniform in (-amp, amp): (2 * unif - 1) * fp32(amp), one rounding."""
    return (unif(seed, name, n) * np.float32(2) - np.float32(1)) * np.float32(amp)
