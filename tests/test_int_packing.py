"""Nibble unpacking against an independent bit-by-bit packer written from the format description."""
import numpy as np
import pytest

from builder.quant.int_packing import pack_uint_lowfirst, unpack_int4_words


def pack_reference(values, slot_to_element):
    words = []
    for start in range(0, len(values), 8):
        word = 0
        for slot in range(8):
            word |= (int(values[start + slot_to_element[slot]]) & 0xF) << (4 * slot)
        words.append(word)
    return np.array(words, dtype=np.uint32).view(np.int32)


@pytest.mark.parametrize("pack_method,order", [("reorder", [0, 2, 4, 6, 1, 3, 5, 7]), ("order", list(range(8)))])
@pytest.mark.parametrize("signed", [False, True])
def test_unpack_matches_reference(pack_method, order, signed):
    rng = np.random.default_rng(1)
    values = rng.integers(-8, 8, 64) if signed else rng.integers(0, 16, 64)
    words = pack_reference(values, order)
    got = unpack_int4_words(words[None], pack_method, signed)[0]
    np.testing.assert_array_equal(got, values)


def test_wrong_order_is_detected():
    values = np.arange(8) + 1
    words = pack_reference(values, [0, 2, 4, 6, 1, 3, 5, 7])
    assert not np.array_equal(unpack_int4_words(words[None], "order", False)[0], values)


def test_matmulnbits_packing_low_nibble_first():
    packed = pack_uint_lowfirst(np.array([[1, 2, 3, 4, 5]], np.uint8), 4)
    np.testing.assert_array_equal(packed, [[0x21, 0x43, 0x05]])
