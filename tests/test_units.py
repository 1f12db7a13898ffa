"""Byte sizes: one formatter for tables, errors and reports, and a parser for what users type."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloadctl.core.errors import OffloadError
from offloadctl.core.units import MAX_BYTES, byte_arg, fmt_bytes, parse_bytes


@pytest.mark.parametrize(
    ("n", "text"),
    [(None, "?"), (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (10039328, "9.57 MiB"), (3 * 2**30, "3.00 GiB")],
)
def test_fmt_bytes(n, text):
    assert fmt_bytes(n) == text


def test_round_up_never_understates():
    assert fmt_bytes(10039328, round_up=True) == "9.58 MiB"
    assert byte_arg(10039328) == "9.58MiB" and parse_bytes("9.58MiB") >= 10039328
    assert byte_arg(3072) == "3.00KiB" and byte_arg(100) == "100B"


@given(st.integers(min_value=0, max_value=2**50))
def test_byte_arg_parses_back_to_at_least_the_size_and_close_to_it(n):
    back = parse_bytes(byte_arg(n))
    assert n <= back <= n * 1.01 + 1


@pytest.mark.parametrize("text", ["", "1.5XB", "-3", "MiB", "1e3"])
def test_parse_bytes_refuses_what_is_not_a_size(text):
    with pytest.raises(OffloadError, match="not a byte size"):
        parse_bytes(text)


def test_sizes_parse_exactly_up_to_64_bits():
    assert parse_bytes("9223372036854775807") == MAX_BYTES
    assert parse_bytes("1TiB") == 2**40 and parse_bytes("0.1KB") == 100  # no float rounding
    with pytest.raises(OffloadError, match="more bytes than any device has"):
        parse_bytes("123456789012345678901234567890")
