"""What the memory benchmarks of the streaming analyses share (`probe_bench`, `neighbours_bench`):
the analysis runs in a fresh process with a lowered block bound (`analyses.streaming.BLOCK_BYTES`)
and reports its resident memory before reading any row (VmRSS) and its peak (VmHWM); two stores,
one several times the other, show whether the peak's growth follows the block or the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .common import REPO

# prepended to a child's code: `status(key)`, a /proc/self/status figure in bytes (Linux)
CHILD_PREAMBLE = """
import json, sys
from analyses import streaming
from analyses.tables import open_models

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

streaming.BLOCK_BYTES = int(sys.argv[2])
ds = open_models(sys.argv[1])["syn/probe"]
"""


def child_memory(code: str, store: Path, block: int, what: str) -> dict[str, Any]:
    """Run CHILD_PREAMBLE + `code` on `store` with the block bound `block` (bytes) in a fresh
    interpreter; the JSON object it prints last (it prints idle_rss, peak_rss and hidden_bytes)."""
    done = subprocess.run([sys.executable, "-c", CHILD_PREAMBLE + code, str(store), str(block)], capture_output=True,
                          text=True, cwd=REPO, timeout=3600, env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    growth = out["peak_rss"] - out["idle_rss"]
    return {**out, "block_bytes": block, "store_over_block": out["hidden_bytes"] / block, "growth": growth,
            "growth_over_block": growth / block, "growth_over_store": growth / out["hidden_bytes"]}


def report(arms: list[dict[str, Any]], held: str, out: str | None) -> dict[str, Any]:
    """Print each arm (the `held` field: bytes the analysis holds by design, named) and the ratio of
    the two peak growths against the ratio of the stores; write it all to `out` as JSON."""
    mb = 1e6
    for arm in arms:
        print(f"hidden {arm['hidden_bytes'] / mb:.1f} MB = {arm['store_over_block']:.1f} × the block bound "
              f"({arm['block_bytes'] / mb:.1f} MB); peak RSS {arm['peak_rss'] / mb:.0f} MB, idle "
              f"{arm['idle_rss'] / mb:.0f} MB: growth {arm['growth'] / mb:.1f} MB ({held.replace('_', ' ')}: "
              f"{arm[held] / mb:.2f} MB)")
    result = {"arms": arms, "store_ratio": arms[1]["hidden_bytes"] / arms[0]["hidden_bytes"],
              "growth_ratio": arms[1]["growth"] / arms[0]["growth"]}
    print(f"store × {result['store_ratio']:.2f} -> peak growth × {result['growth_ratio']:.2f}")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result
