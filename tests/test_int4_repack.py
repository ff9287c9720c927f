"""Block repacking of Quark's 4-bit words into MatMulNBits B, against a bit-by-bit packer and unpacker written from
the format descriptions (quark_format.md section 3; MatMulNBits: two values per byte along K, low nibble first)."""
import numpy as np
import pytest

from builder.quant.int4_repack import repack_rows, unsigned_zero_points

SLOTS = {"reorder": [0, 2, 4, 6, 1, 3, 5, 7], "order": list(range(8))}


def quark_words(q: np.ndarray, slot_to_element) -> np.ndarray:
    """q [N, K] ints -> Quark's transposed words [K, ceil(N/8)] int32, one nibble at a time."""
    n, k = q.shape
    words = np.zeros((k, -(-n // 8)), np.uint64)
    for kk in range(k):
        for c in range(words.shape[1]):
            word = 0
            for slot in range(8):
                row = 8 * c + slot_to_element[slot]
                if row < n:
                    word |= (int(q[row, kk]) & 0xF) << (4 * slot)
            words[kk, c] = word
    return words.astype(np.uint32).view(np.int32)


def matmulnbits_bytes(u: np.ndarray) -> np.ndarray:
    out = np.zeros((u.shape[0], u.shape[1] // 2), np.uint8)
    for n in range(u.shape[0]):
        for j in range(u.shape[1] // 2):
            out[n, j] = int(u[n, 2 * j]) | (int(u[n, 2 * j + 1]) << 4)
    return out


@pytest.mark.parametrize("pack_method", ["reorder", "order"])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("n,n0,n1", [(40, 0, 40), (40, 8, 24), (37, 16, 37)])
def test_repack_rows_matches_bitwise_reference(pack_method, signed, n, n0, n1):
    rng = np.random.default_rng(3)
    k = 12
    q = rng.integers(-8, 8, (n, k)) if signed else rng.integers(0, 16, (n, k))
    words = quark_words(q, SLOTS[pack_method])
    u = (q + 8) if signed else q  # MatMulNBits' unsigned domain: W = (u - zp) * scale with zp shifted alike
    np.testing.assert_array_equal(repack_rows(words, n0, n1, pack_method, signed), matmulnbits_bytes(u)[n0:n1])


@pytest.mark.parametrize("signed", [False, True])
def test_zero_points_unsigned_domain(signed):
    rng = np.random.default_rng(4)
    zp = rng.integers(-8, 8, (13, 3)) if signed else rng.integers(0, 16, (13, 3))  # [N, groups]
    words = quark_words(zp, SLOTS["reorder"])  # [groups, ceil(N/8)]
    got = unsigned_zero_points(words, 13, 3, "reorder", signed)
    np.testing.assert_array_equal(got, zp + 8 if signed else zp)
    np.testing.assert_array_equal(unsigned_zero_points(None, 13, 3, "reorder", signed), np.full((13, 3), 8 * signed))
