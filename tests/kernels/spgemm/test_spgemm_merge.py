"""spgemm.merge's host side on the CPU: its rounds, buffers, registration and kernel names."""
import re

from matplan.kernels import _cuda, get
from matplan.kernels.spgemm import merge as spgemm_merge
from matplan.kernels.sptrans import gpu as sptrans


def test_rounds_and_buffers():
    """A row of up to one tile of products needs no tree round; each doubling of tiles one more."""
    t = sptrans.TILE
    assert [spgemm_merge.rounds_for(x) for x in (0, 1, t, t + 1, 2 * t, 2 * t + 1, 1000 * t)] == [0, 0, 0, 1, 1, 2, 10]
    assert spgemm_merge.buffer_bytes(10, 8) == 10 * (16 + 4 + 16)


def test_registered_deterministic_and_names_match_the_cu():
    k = get("spgemm.merge")
    assert k.deterministic and k.ops == ("spgemm",) and k.backend == "gpu"
    text = re.sub(r"//[^\n]*", "", _cuda.source(spgemm_merge.SOURCE))
    declared = set(re.findall(r'extern "C" __global__ void (\w+)\(', text))
    declared |= {f"{n}<{t}>" for n, t in re.findall(r"template __global__ void (\w+)<(\w+)>\(", text)}
    assert set(spgemm_merge._NAMES) == declared
