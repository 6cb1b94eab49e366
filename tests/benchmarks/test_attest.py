"""benchmarks/_common.attest: a result run from a copy names HEAD only where its sources are HEAD's."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import _common  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)


def test_attest_names_head_only_for_heads_sources(tmp_path):
    head, digest = _common._git("rev-parse", "HEAD"), _common.head_source_digest()
    if head is None or digest is None:
        pytest.skip("not a git checkout")
    ours = tmp_path / "a-h100.json"
    ours.write_text(json.dumps({"commit": "948308014f", "commit_source": "git", "tree_dirty": True,
                                "source_digest": digest, "rows": [1]}))
    other = tmp_path / "b-h100.json"
    other.write_text(json.dumps({"commit": "948308014f", "commit_source": "git", "tree_dirty": True,
                                 "source_digest": "0" * 16}))
    lines = _common.attest([ours, other])
    got, kept = json.loads(ours.read_text()), json.loads(other.read_text())
    assert got["commit"] == head and got["tree_dirty"] is False and digest in got["commit_source"]
    assert got["rows"] == [1] and "948308014f" in got["commit_source"]
    assert kept["commit"] == "948308014f" and kept["tree_dirty"] is True
    assert "left as is" in lines[1]
