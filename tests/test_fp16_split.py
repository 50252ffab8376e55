"""The fp16-parts arithmetic of exact fp32 all pairs on Hopper (csrc/fwd_split_fp16.cu), modelled
on the CPU: a row is scaled by 2^k so that its largest finite magnitude lies in [2^14, 2^15), each
y = x * 2^k is stored as hi = fp16(y) and lo = fp16(y - hi), and the tensor core sums the exact
products hi * hi + hi * lo + lo * hi in fp32. Plain parts stay within about 2^-21 |x| |y| per
product; the kept-sign parts (taken where the other side holds an Inf) within 1.5 * 2^-20, and
their products with an Inf follow fp32."""

import numpy as np
import pytest

TINY = np.float16(2.0**-24)  # fp16's smallest subnormal


def row_scale(row):
    """The power of two a row is multiplied by (as split_fp16_kernel picks it)."""
    finite = np.abs(row[np.isfinite(row)])
    top = finite.max() if finite.size else 0.0
    k = 0 if top == 0 else int(np.clip(14 - np.floor(np.log2(top)), -126, 126))
    return np.float32(2.0**k)


def parts(x, scale, kept_sign=False):
    """(hi, lo) of each value of x as split_fp16 makes them."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x * scale
        hi = y.astype(np.float16)
        if kept_sign:  # cut toward zero, one step lower where exact; no part vanishes
            zero = np.float16(0)
            hi = np.where(np.abs(hi.astype(np.float32)) > np.abs(y), np.nextafter(hi, zero), hi)
            hi = np.where((hi.astype(np.float32) == y) & (y != 0), np.nextafter(hi, zero), hi)
        lo = (y - hi.astype(np.float32)).astype(np.float16)
        if kept_sign:
            tiny = np.copysign(TINY, y).astype(np.float16)
            lo = np.where((lo == 0) & (y != 0), tiny, lo)
            hi = np.where((hi == 0) & (y != 0), tiny, hi)
        keep = x.astype(np.float16)  # NaN in both parts, +-Inf in both
    return np.where(np.isfinite(x), hi, keep), np.where(np.isfinite(x), lo, keep)


def product(qp, dp):
    """hi * hi + hi * lo + lo * hi of two split values (float64: each fp16 product is exact)."""
    (qh, ql), (dh, dl) = [(h.astype(np.float64), lo.astype(np.float64)) for h, lo in (qp, dp)]
    with np.errstate(invalid="ignore"):
        return qh * dl + ql * dh + qh * dh


def random_rows(rng, n, h=128):
    """Rows of values from 2^-12 to 1 of their largest, the rows scaled by 2^-100 .. 2^100."""
    x = rng.standard_normal((n, h)) * 2.0 ** rng.integers(-12, 1, (n, h))
    return (x * 2.0 ** rng.integers(-100, 100, (n, 1))).astype(np.float32)


@pytest.mark.parametrize("kept_sign, rel, ulps", [(False, 2.0**-21, 2.0**-24), (True, 1.5 * 2.0**-20, 2.0**-22)])
def test_products_stay_within_their_bound(kept_sign, rel, ulps):
    """Scaled products within rel |x y| plus, for values whose parts reach fp16's subnormals (lo
    below about 2^-17 of the row's largest, hi below 2^-28), an absolute error of a few subnormal
    steps times the other value."""
    rng = np.random.default_rng(0)
    q, d = random_rows(rng, 2000), random_rows(rng, 2000)
    sq = np.array([row_scale(r) for r in q])[:, None]
    sd = np.array([row_scale(r) for r in d])[:, None]
    got = product(parts(q, sq, kept_sign), parts(d, sd, kept_sign))
    qy, dy = q.astype(np.float64) * sq, d.astype(np.float64) * sd
    exact = qy * dy
    assert np.all(np.abs(got - exact) <= rel * np.abs(exact) + ulps * (np.abs(qy) + np.abs(dy)))
    normal = (np.abs(qy) >= 2.0**-3) & (np.abs(dy) >= 2.0**-3)  # both parts normal fp16
    assert np.all(np.abs(got - exact)[normal] <= rel * np.abs(exact)[normal])


def test_scales_bring_every_finite_row_into_fp16():
    rows = np.array([[3.4e38, -1.0, 0.0], [1e-44, 2e-45, 0.0], [0.0, 0.0, 0.0], [np.inf, np.nan, 5.0]],
                    np.float32)
    for r in rows:
        s = row_scale(r)
        assert np.isfinite(s) and np.isfinite(np.float32(1) / s)
        hi, _ = parts(r, s)
        finite = np.isfinite(r)
        assert np.all(np.isfinite(hi[finite].astype(np.float32)))
        top = np.abs(r[finite]).max()
        assert top == 0 or top < 2e-38 or 2.0**14 <= top * s < 2.0**15


def test_kept_sign_parts_keep_inf_products_as_in_fp32():
    """Inf times a nonzero value's kept-sign parts has the product's sign, never NaN, down to the
    row's smallest values; the plain parts give NaN (an Inf times a zero remainder, or remainders
    of the opposite sign), which is why the other side's Inf chooses the split."""
    rng = np.random.default_rng(1)
    d = random_rows(rng, 200)
    d[:, :4] = [1.0, -0.5, 2.0**-30, -(2.0**-40)]  # exact parts; values deep below the row's top
    s = np.array([row_scale(r) for r in d])[:, None]
    for inf in (np.inf, -np.inf):
        q = parts(np.float32([inf]), np.float32(1))
        want = np.float64(inf) * d
        assert np.array_equal(product(q, parts(d, s, kept_sign=True)), want)
        assert np.isnan(product(q, parts(d, s))).any()
    zero = product(parts(np.float32([np.inf]), np.float32(1)), parts(np.float32([0.0]), s[0], kept_sign=True))
    assert np.isnan(zero).all()  # Inf * 0 is NaN in fp32 too
