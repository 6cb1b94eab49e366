"""kernels_for keeps its sorted list per (op, backend) only while the registry holds the very same
kernel objects: an entry replaced in place (as tests and calibration do), one added or one removed
is seen at the next call; the planner's candidates follow."""
from matplan.kernels import base, kernels_for, registry


class _Twin(base.KeepsA):
    """Another object of a registered kernel's name (equal to it by every attribute but identity)."""
    ops = ("spgemm",)
    backend = "gpu"

    def __init__(self, name):
        self.name = name


def test_the_sorted_list_follows_the_registry(monkeypatch):
    first = kernels_for("spgemm", "gpu")
    assert [k.name for k in first] == sorted(k.name for k in first) and first
    assert kernels_for("spgemm", "gpu") == first and kernels_for("spgemm", "gpu") is not first   # a copy each call
    name = first[0].name
    twin = _Twin(name)
    monkeypatch.setitem(registry._REGISTRY, name, twin)   # replaced in place: same keys, same count
    got = kernels_for("spgemm", "gpu")
    assert got[0] is twin and got[1:] == first[1:]
    monkeypatch.setitem(registry._REGISTRY, "spgemm.zz_extra", _Twin("spgemm.zz_extra"))
    assert [k.name for k in kernels_for("spgemm", "gpu")] == [k.name for k in first] + ["spgemm.zz_extra"]
    monkeypatch.undo()
    assert [k is f for k, f in zip(kernels_for("spgemm", "gpu"), first)] == [True] * len(first)
