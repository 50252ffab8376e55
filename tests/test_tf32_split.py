"""The split-TF32 arithmetic of the fp32 tensor-core tiles (csrc/mma.cuh), modelled on the CPU: the
tensor core reads an fp32 operand's top 19 bits (TF32) and multiplies exactly, so a product
x * y is taken as lo(x) * hi(y) + cross(x) * lo(y) + hi(x) * hi(y) over the operands' bits.
``split_tf32`` must stay within about 2^-21 |x| |y|; ``split_tf32_signed`` (the documents' split
where the query tile holds Inf) within 2^-20, and its products with an Inf follow fp32."""

import numpy as np
import pytest

MASK = np.uint32(0xFFFFE000)  # the bits a TF32 operand keeps


def bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def floats(b):
    return np.asarray(b, dtype=np.uint32).view(np.float32)


def round_tf32(b):
    return (b + np.uint32(0x1000)) & MASK


def tf32_of(b):
    f = floats(b)
    return np.where(f == f, round_tf32(b), b)


def split_tf32(b):
    """(hi, cross, lo) as split_tf32 makes them."""
    f = floats(b)
    r = round_tf32(b)
    lo = bits(f - floats(r))
    inf = np.abs(f) >= floats(np.uint32(0x7F7FF000))
    zero = np.zeros_like(b)
    return r, np.where(inf, zero, r), np.where(inf, zero, lo)


def split_tf32_signed(b):
    """(hi, cross, lo) as split_tf32_signed makes them."""
    f = floats(b)
    hi = b & MASK
    step = (hi == b) & (f != 0) & ~np.isinf(f)
    hi = np.where(step, hi - np.uint32(0x2000), hi)
    lo = tf32_of(bits(f - floats(hi)))
    inf = np.isinf(f)
    one = bits(np.copysign(np.float32(1), f))
    return np.where(inf, b, hi), np.where(inf, 0, hi).astype(np.uint32), np.where(inf, one, lo)


def product(x, y, split_x):
    """x * y as the three TF32 products (y split as the query tile stores it), in float64."""
    with np.errstate(invalid="ignore", over="ignore"):
        xh, xc, xl = (floats(v & MASK).astype(np.float64) for v in split_x(bits(x)))
        yh, _, yl = (floats(v & MASK).astype(np.float64) for v in split_tf32(bits(y)))
        return xl * yh + xc * yl + xh * yh


@pytest.mark.parametrize("split, bound", [(split_tf32, 2.0**-21), (split_tf32_signed, 2.0**-20)])
def test_products_are_within_their_bound(split, bound):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200_000) * 2.0 ** rng.integers(-20, 20, 200_000)).astype(np.float32)
    y = (rng.standard_normal(200_000) * 2.0 ** rng.integers(-20, 20, 200_000)).astype(np.float32)
    x[:1000] = np.round(x[:1000] * 8) / 8  # values TF32 holds exactly: remainders of 0
    exact = x.astype(np.float64) * y.astype(np.float64)
    err = np.abs(product(x, y, split) - exact) / (np.abs(x.astype(np.float64) * y) + 1e-300)
    assert err.max() <= bound


def test_signed_split_keeps_inf_products_as_fp32():
    """A query value of +-Inf times any document value: sign(x) * Inf, NaN for 0 and NaN, as fp32
    gives. The plain split makes NaN of some (a remainder of 0 or of the other sign times Inf)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(10_000).astype(np.float32)
    x[:100] = np.round(x[:100] * 8) / 8  # exact in TF32
    x[100:110] = 0.0
    x[110:120] = np.inf
    x[120:130] = -np.inf
    x[130] = np.nan
    for y in (np.inf, -np.inf):
        ys = np.full_like(x, y)
        with np.errstate(invalid="ignore"):
            want = x.astype(np.float64) * y
        got = product(x, ys, split_tf32_signed)
        np.testing.assert_array_equal(got, want)
        assert np.isnan(product(x, ys, split_tf32)[:100]).any()


def test_inf_documents_against_finite_queries():
    """Document values of +-Inf (both splits) times finite query values: sign * Inf, NaN for 0."""
    y = np.array([1.5, -0.3, 2.0**-10, 0.0, 1e30], dtype=np.float32)
    for split in (split_tf32, split_tf32_signed):
        for x in (np.inf, -np.inf):
            with np.errstate(invalid="ignore"):
                want = np.float64(x) * y.astype(np.float64)
            np.testing.assert_array_equal(product(np.full_like(y, x), y, split), want)
