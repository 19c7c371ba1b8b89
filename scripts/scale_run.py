"""Copy a stored run with every sample multiplied by a factor, through the store API: a synthetic
regression (or speed-up) to check that `nearlocal compare` reports it.

    python scripts/scale_run.py RUN 1.3 --out results     # prints the new run's directory
    nearlocal compare RUN NEW-RUN --out results           # every settled case slower, exit 1
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from nearlocal.core.sampling import summarize
from nearlocal.store import Store, load


def scale_run(ref: str, factor: float, root: Path) -> Path:
    run = load(ref, root)
    store = Store.create(root, {**run.meta, "scaled_from": run.run_id, "scale_factor": factor})
    by_case = dict(tuple(run.samples.groupby("case_id", sort=False)))
    for row in run.cases.to_dict("records"):
        row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        samples = by_case.get(row["case_id"])
        if samples is None or row["status"] != "ok":
            store.add_case(row)
            continue
        ns = samples["ns"].to_numpy(dtype=np.float64) * factor
        raw = samples["raw"].to_numpy(dtype=np.float64) * factor
        row.update(summarize(ns, int(row["bytes_moved"])))
        store.add_case(row, raw, ns, samples["process"].to_numpy())  # keep the process tags
    return store.finish(ended=run.meta.get("ended"), interrupted=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run id or directory")
    parser.add_argument("factor", type=float, help="multiply every sample by this, e.g. 1.3")
    parser.add_argument("--out", default="results", help="the store's root (default ./results)")
    args = parser.parse_args(argv)
    print(scale_run(args.run, args.factor, Path(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
