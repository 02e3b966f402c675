"""Only the step-data store (common/step_data.py) names step-data keys in the three planes.

Sharding step data (issue "data shard") changes the store alone as long as nothing else in
``common/``, ``coordinator/`` or ``workers/`` builds a chunk blob, buffer stream or buffer stats
key; common/keys.py defines them.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLANES = ("common", "coordinator", "workers")
ALLOWED = {Path("common/step_data.py"), Path("common/keys.py")}
STEP_DATA_KEY = re.compile(
    r"\bkeys\.(data\(|data_staged\b|data_pattern\b|buffer_meta\b|buffer_stats\b|buffers_pattern\b)")


def step_data_key_uses(root: Path) -> list[str]:
    """``path:line: text`` of every line outside :data:`ALLOWED` that names a step-data key."""
    hits = []
    for plane in PLANES:
        for path in sorted((root / plane).rglob("*.py")):
            rel = path.relative_to(root)
            if rel in ALLOWED:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if STEP_DATA_KEY.search(line):
                    hits.append(f"{rel}:{n}: {line.strip()}")
    return hits


def test_only_the_store_names_step_data_keys():
    hits = step_data_key_uses(ROOT)
    assert not hits, "step-data keys named outside common/step_data.py:\n" + "\n".join(hits)


def test_the_pattern_sees_each_spelling(tmp_path):
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "x.py").write_text(
        "keys.data(ns, d)\nkeys.data_staged(ns, d)\nkeys.data_pattern(ns)\nkeys.buffer_meta(ns, b)\n"
        "keys.buffer_stats(ns, b)\nkeys.buffers_pattern(ns)\nkeys.data_id\nkeys.database\n")
    assert [h.split(":")[1] for h in step_data_key_uses(tmp_path)] == ["1", "2", "3", "4", "5", "6"]
