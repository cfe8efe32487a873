"""SIZE arguments (the gates' limits) in the units people write."""

from heapsight.fmt import parse_size


def test_sizes_parse_in_the_units_people_write():
    assert parse_size("512") == 512
    assert parse_size("64K") == parse_size("64KiB") == 65536
    assert parse_size("1.5M") == 1572864 and parse_size("2GB") == 2_000_000_000
    assert parse_size("1g") == 1 << 30
    for bad in ("", "lots", "-1M", "1X", "inf", "nan"):
        try:
            parse_size(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")
