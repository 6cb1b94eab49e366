"""core.cache: the one bounded LRU cache and matplan.cache_info()."""
import numpy as np
import pytest

import matplan
from matplan.core.cache import BoundedCache, _count, cache_info, clear_all
from matplan.core.validation import check_int


def test_lru_bound_by_entries_counts_hits_misses_and_evictions():
    evicted = []
    c = BoundedCache("test.entries", 2, on_evict=lambda k, v: evicted.append(k))
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1          # a is now the most recent
    c.put("c", 3)                   # drops b
    assert "b" not in c and c.get("b") is None
    assert evicted == ["b"]
    i = c.info()
    assert (i.hits, i.misses, i.evictions, i.entries) == (1, 1, 1, 2)


def test_bound_by_bytes_and_pop_and_get_or_create():
    c = BoundedCache("test.bytes", 10, maxbytes=100, sizeof=len)
    c.put(1, b"x" * 60)
    c.put(2, b"y" * 30)
    assert c.info().nbytes == 90
    c.put(3, b"z" * 30)             # 120 > 100: the oldest goes
    assert 1 not in c and c.info().nbytes == 60
    assert c.pop(2) == b"y" * 30 and c.info().nbytes == 30
    made = []
    assert c.get_or_create(4, lambda: made.append(1) or b"w") == b"w"
    assert c.get_or_create(4, lambda: made.append(1) or b"v") == b"w"
    assert made == [1]


def test_cache_info_lists_every_cache_and_clear_all_empties_them():
    c = BoundedCache("test.listed", 4)
    c.put("k", "v")
    info = matplan.cache_info()
    assert info["test.listed"].entries == 1
    assert cache_info() == matplan.cache_info()
    clear_all()
    assert len(c) == 0 and matplan.cache_info()["test.listed"].entries == 0


def test_same_name_is_listed_twice_under_distinct_names():
    a, b = BoundedCache("test.twice", 1), BoundedCache("test.twice", 1)
    assert a.name != b.name and {a.name, b.name} <= set(cache_info())


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8", np.int64(-1), np.bool_(True), np.float64(2.0)])
def test_bad_bounds_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="maxsize: expected a non-negative integer"):
        BoundedCache("test.bad", bad)
    with pytest.raises(ValueError, match="maxbytes: expected None or a non-negative integer"):
        BoundedCache("test.bad", 1, maxbytes=bad)


@pytest.mark.parametrize("value", [0, 5, np.int64(3), np.uint8(0), -1, np.int32(-2), True, np.bool_(False), 1.0,
                                   np.float32(2), "2", None])
def test_bounds_follow_check_ints_rule(value):
    """BoundedCache's bounds take exactly what core.validation.check_int(minimum=0) takes."""
    try:
        want = check_int(value, "maxsize", "a non-negative integer", minimum=0)
    except ValueError as exc:
        with pytest.raises(ValueError) as err:
            _count(value, "maxsize", "a non-negative integer")
        assert str(err.value) == str(exc)
    else:
        assert _count(value, "maxsize", "a non-negative integer") == want


def test_numpy_integer_bounds_are_taken_as_ints():
    """Issue 40 item 4: NumPy integers wherever Python integers are; kept as Python ints."""
    c = BoundedCache("test.npint", np.int64(2), maxbytes=np.uint32(100), sizeof=lambda v: 40)
    assert type(c.maxsize) is int and type(c.maxbytes) is int and (c.maxsize, c.maxbytes) == (2, 100)
    for i in range(3):
        c.put(i, i)
    assert len(c) == 2 and c.get(0) is None


def test_get_fast_counts_but_does_not_reorder():
    c = BoundedCache("test.fast", 2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get_fast("a") == 1 and c.get_fast("z") is None
    c.put("c", 3)                   # a was not refreshed: it is the oldest and goes
    assert "a" not in c and "b" in c
    i = c.info()
    assert (i.hits, i.misses) == (1, 1)
