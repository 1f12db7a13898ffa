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


@pytest.mark.parametrize(
    "text, si, iec",
    [("8M", "8,000,000", "8,388,608"), ("8mb", "8,000,000", "8,388,608"), ("2k", "2,000", "2,048"),
     ("1Gb", "1,000,000,000", "1,073,741,824"), ("3t", "3,000,000,000,000", "3,298,534,883,328")],
)  # fmt: skip
def test_an_ambiguous_unit_is_refused_with_both_readings(text, si, iec):
    with pytest.raises(OffloadError, match="is ambiguous") as caught:
        parse_bytes(text)
    assert f"for {si} bytes" in caught.value.hint and f"for {iec} bytes" in caught.value.hint


@pytest.mark.parametrize(
    "text, expected",
    [("8MB", 8_000_000), ("8kB", 8000), ("8KB", 8000), ("8MiB", 8 << 20), ("8mib", 8 << 20), ("8B", 8), ("8", 8)],
)
def test_si_and_iec_units_read_as_the_standards_write_them(text, expected):
    assert parse_bytes(text) == expected


def test_budget_and_max_peak_verdicts_quote_the_bytes_understood(run_cli, tmp_path):
    from conftest import SAMPLES

    bert = SAMPLES / "bert" / "model.onnx"
    refused = run_cli("plan", bert, "--params", "--budget", "65k", "-o", tmp_path / "p.json")
    assert refused.exit_code == 2 and "write 65kB for 65,000 bytes or 65KiB for 66,560 bytes" in refused.stderr
    made = run_cli("plan", bert, "--params", "--budget", "65KiB", "--max-peak", "70kB", "-o", tmp_path / "p.json")
    assert made.exit_code == 0, made.stderr
    assert "| budget 65.00 KiB (66,560 B), --max-peak 68.36 KiB (70,000 B) |" in made.stdout
    doc = run_cli("simulate", bert, "--plan", tmp_path / "p.json", "--max-peak", "70kB", "--json").json()
    assert doc["max_peak_bytes"] == 70_000
    shown = run_cli("simulate", bert, "--plan", tmp_path / "p.json", "--max-peak", "70kB")
    assert "--max-peak 68.36 KiB (70,000 B)" in shown.stdout
