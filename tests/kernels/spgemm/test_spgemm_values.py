"""CPU tests of the values-only replay's host rules (rules.values_*), its sources' registration
and spgemm's ``values`` argument."""
import pytest

import matplan.kernels.spgemm as spgemm
from matplan.kernels import prebuild
from matplan.kernels.spgemm import guesses, rules, runtime


def test_lanes_follow_products_per_entry():
    assert rules.values_lanes(12_527_104, 6_382_336) == 1      # Poisson: ~2 products an entry
    assert rules.values_lanes(57_797_960, 6_599_728) == 4      # banded: ~8.8
    assert rules.values_lanes(249_091_200, 3_731_550) == 32    # block-dense: ~67
    assert rules.values_lanes(10, 0) == 4                      # no entries: as one entry of all products
    assert all(rules.values_lanes(p, 1000) in rules.VALUES_LANES for p in (0, 1, 4000, 10 ** 7))


def test_kept_and_setup_bytes():
    p, nc, m, words = 1000, 300, 50, 700
    kept = rules.values_kept_bytes(p, nc, m, words)
    assert kept == 8 * p + 4 * (nc + 1) + 4 * (m + 1 + nc) + 4 * words
    assert rules.values_setup_bytes(p, nc, m, words) == kept + 8 * p + 16 * (nc + 1)
    big = rules.INT32_MAX + 1   # offsets go int64 past int32 products
    assert rules.values_offset_bytes(big) == 8 and rules.values_offset_bytes(rules.INT32_MAX) == 4
    assert rules.values_kept_bytes(big, nc, m, words) - 8 * big == 8 * (nc + 1) + 4 * (m + 1 + nc) + 4 * words


def test_refusal_by_cap_and_free_memory(monkeypatch):
    p, nc, m, words = 10 ** 6, 4 * 10 ** 5, 10 ** 5, 10 ** 6
    kept = rules.values_kept_bytes(p, nc, m, words)
    setup = rules.values_setup_bytes(p, nc, m, words)
    assert rules.values_refusal(p, nc, m, words, None) is None
    assert rules.values_refusal(p, nc, m, words, 10 * setup) is None
    why = rules.values_refusal(p, nc, m, words, 2 * kept)
    assert "25%" in why and "keep" in why
    p2, nc2, m2, w2 = 10 ** 6, 10 ** 5, 10 ** 4, 10 ** 3   # the setup more than twice the kept bytes
    kept2 = rules.values_kept_bytes(p2, nc2, m2, w2)
    why = rules.values_refusal(p2, nc2, m2, w2, 4 * kept2)   # kept fits a quarter, the setup not half
    assert why is not None and "setup" in why
    monkeypatch.setattr(rules, "VALUES_MAX_BYTES", kept - 1)
    assert "VALUES_MAX_BYTES" in rules.values_refusal(p, nc, m, words, None)


def test_sources_registered_for_prebuild():
    names = runtime.SOURCES["spgemm/values_replay.cu"]
    assert len(names) == 2 * 2 * len(rules.VALUES_LANES)
    assert "values_replay<double, int, 1>" in names and "values_replay<float, long long, 32>" in names
    for kernel in ("values_count", "values_place", "values_sort_short", "values_sort_long", "values_differ"):
        assert runtime._SOURCE_OF[kernel] == "spgemm/values_replay.cu"
    assert prebuild.instances()["spgemm/values_replay.cu"] == names


def test_values_argument_checked():
    with pytest.raises(TypeError, match="values"):
        spgemm.spgemm(None, None, values="yes")


def test_values_key_is_the_guess_key_without_the_values():
    """A replay is keyed by the operands' structure: the guess key less the data addresses and
    cupyx's sortedness flag; none for unsorted rows."""
    parts = ((1, 2, 3, (4, 5), 6, "<f8", True), (11, 12, 13, (5, 4), 7, "<f8", None))
    key = (0, 99, parts, True, None, "auto", True)
    assert guesses._values_key(key) == ("values", 0, 99, ((2, 3, (4, 5), 6, "<f8"), (12, 13, (5, 4), 7, "<f8")),
                                        None, "auto", True)
    assert guesses._values_key(key[:3] + (False,) + key[4:]) is None


def test_values_key_needs_sorted_rows_and_guesses(monkeypatch):
    # without CuPy (or operands that are not cupyx CSR) no key: nothing kept
    assert guesses._values_key(guesses._guess_key(None, None, True, None, "auto", True)) is None
    monkeypatch.setattr(guesses, "VALUES_CACHE_SIZE", 0)
    assert guesses._values_key(guesses._guess_key(None, None, True, None, "auto", True)) is None
    assert guesses._values_replayed(None, None, None, {}) is None
