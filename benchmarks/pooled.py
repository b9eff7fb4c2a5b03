"""Section 8 over several runs: each row's paired ratios from every run, pooled.

One run's interval (`common.ratio_ci`) says what its pairs show about the VM's state during that
run. On this project's VM the state moves between runs by more than that interval's width (the
plain loop ran at 4.5 to 10 ms a tiny sample in runs of the same code), so a run can miss a
target that the code meets on average, or meet one it misses. Pooling answers the question a
target asks: what ratio does the code cost here, over the states the machine goes through?

Each run is one draw of the machine's state, so every run weighs the same, whatever its number
of pairs: the pooled figure is the geometric mean of the runs' geometric means, and its interval
is Student's t over the runs' mean log ratios (k - 1 degrees of freedom), which carries both the
pairs' noise and the runs' spread. Runs must be of the same code (see `code` in a results file).

    python -m benchmarks.pooled benchmarks/results/overhead-pool-*.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def mean_log(ratios: list[float]) -> float:
    """A run's mean log ratio: the log of its pairs' geometric mean."""
    return sum(math.log(r) for r in ratios) / len(ratios)


def pooled_ci(runs: list[list[float]], level: float = 0.95) -> tuple[float, float, float]:
    """(geometric mean, low, high) of `runs`, each a run's paired ratios: the mean over runs of
    each run's mean log ratio, with a Student's t interval over the runs. One run has no spread
    between runs to estimate: its interval is (nan, nan), and no target is judged by it."""
    from scipy import stats

    means = [mean_log(ratios) for ratios in runs if ratios]
    if not means:
        raise ValueError("no paired ratios to pool")
    centre = sum(means) / len(means)
    if len(means) < 2:
        return math.exp(centre), math.nan, math.nan
    if max(means) == min(means):  # runs that agree exactly (t of a zero spread is undefined)
        return (math.exp(centre),) * 3
    sem = stats.sem(means)
    low, high = stats.t.interval(level, len(means) - 1, loc=centre, scale=sem)
    return math.exp(centre), math.exp(low), math.exp(high)


def rows_of(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A results file's section-8 rows with paired ratios, by name: the tiny rows as section 8
    names them (`tiny-smolvlm | files in RAM`, ...), a real-size model's as `real: <model>`."""
    sections = results.get("sections", {})
    rows = dict(sections.get("overhead_tiny") or {})
    rows.update({name: {**data["overhead"], "real_size": True} for name, data in sections.items()
                 if name.startswith("real:") and isinstance(data, dict) and isinstance(data.get("overhead"), dict)})
    return {name: row for name, row in rows.items() if isinstance(row, dict) and row.get("pair_ratios")}


def target_of(row: dict[str, Any]) -> float | None:
    """The row's target, as section 8 judges it (`run._overhead_rows`); None for a diagnostic
    row (results dropped, a commit per forward, the hand-written nnsight loop)."""
    from .run import TARGETS

    if row.get("nnsight_only") or not row.get("store_writes", True) or row.get("commit_interval_s") == 0:
        return None
    return TARGETS["overhead_real" if row.get("real_size") else "overhead_tiny"]


def read(files: list[Path]) -> dict[str, dict[str, Any]]:
    """Each results file, by its path, read once."""
    return {str(path): json.loads(Path(path).read_text()) for path in files}


def pool(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row that appears in any of `results` (`read`), pooled over the runs that have it."""
    by_row: dict[str, list[dict[str, Any]]] = {}
    for result in results.values():
        for name, row in rows_of(result).items():
            by_row.setdefault(name, []).append(row)
    out = []
    for name, rows in by_row.items():
        runs = [row["pair_ratios"] for row in rows]
        gmean, low, high = pooled_ci(runs)
        target = target_of(rows[0])
        diagnostic = target is None
        out.append({
            "row": name, "runs": len(runs), "pairs": sum(map(len, runs)),
            "run_gmeans": [round(math.exp(mean_log(r)), 4) for r in runs],
            "gmean": round(gmean, 4), "ci95": None if math.isnan(high) else [round(low, 4), round(high, 4)],
            "target": None if diagnostic else target,
            # one run shows nothing of the next one's state: not judged
            "met": None if diagnostic or len(runs) < 2 else high <= target,
            "runs_met": None if diagnostic else sum(1 for row in rows if "pair_ci95" in row and row["pair_ci95"][1] <= target),
        })
    return out


def table(pooled: list[dict[str, Any]]) -> str:
    lines = ["| row | runs (pairs) | each run's geometric mean | pooled [95 % CI over runs] | target | met | runs whose own interval met it |",
             "|---|---|---|---|---|---|---|"]
    for p in pooled:
        target = "—" if p["target"] is None else f"≤ {p['target']:.2f}"
        met = ("—" if p["target"] is None else "needs 2 runs") if p["met"] is None else ("yes" if p["met"] else "**no**")
        runs_met = "—" if p["runs_met"] is None else f"{p['runs_met']} of {p['runs']}"
        each = ", ".join(f"{g:.3f}" for g in p["run_gmeans"])
        interval = "" if p["ci95"] is None else f" [{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}]"
        lines.append(f"| {p['row'].replace(' | ', ', ')} | {p['runs']} ({p['pairs']}) | {each} | {p['gmean']:.3f}"
                     f"{interval} | {target} | {met} | {runs_met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pooled", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="results JSON files of section 8 (benchmarks.run --out)")
    parser.add_argument("--out", type=Path, help="also write the pooled rows as JSON here")
    args = parser.parse_args(argv)
    results = read(args.files)
    pooled = pool(results)
    codes = {path: result.get("code") for path, result in results.items()}
    if len(set(codes.values())) > 1:  # older files carry no revision (None)
        print("note: these runs measured different code, or say nothing of theirs: "
              + ", ".join(f"{Path(f).name}: {c or 'unrecorded'}" for f, c in codes.items()))
    print(table(pooled))
    if args.out:
        args.out.write_text(json.dumps({"files": codes, "rows": pooled}, indent=1) + "\n")


if __name__ == "__main__":
    main()
