"""spgemm.merge's host side on the CPU: its rounds, buffers, registration and kernel names."""
import re

from matplan.kernels import _cuda, get, spgemm_merge


def test_rounds_and_buffers():
    """Rows of A of 0 or 1 nonzero need no round; each doubling of the widest row one more."""
    assert [spgemm_merge.rounds_for(x) for x in (0, 1, 2, 3, 4, 5, 1024, 1025)] == [0, 0, 1, 2, 2, 3, 10, 11]
    assert spgemm_merge.buffer_bytes(10, 8) == 10 * 2 * 12


def test_registered_deterministic_and_names_match_the_cu():
    k = get("spgemm.merge")
    assert k.deterministic and k.ops == ("spgemm",) and k.backend == "gpu"
    text = re.sub(r"//[^\n]*", "", _cuda.source(spgemm_merge.SOURCE))
    declared = set(re.findall(r'extern "C" __global__ void (\w+)\(', text))
    declared |= {f"{n}<{t}>" for n, t in re.findall(r"template __global__ void (\w+)<(\w+)>\(", text)}
    assert set(spgemm_merge._NAMES) == declared
