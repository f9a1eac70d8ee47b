"""Merges the results of a partial GPU bench run (`gpu-bench.sh` with DLKERN_BENCHES,
DLKERN_ORT_OPS, ...) into the recorded full run, so that BENCHMARKS.md shows every row at its
latest measurement and says which rows came from which run:

    python python/merge_results.py benches/results/latest.json NEW.json --note "what the partial run re-measured"

Criterion rows (and their metadata) are replaced by id; ORT rows by (op, kind): a partial run
that measured an op replaces every old row of that op (with `--by-case`, only the rows of the
cases it measured: a run of some formats of an op beside a recorded table of others); PyTorch comparison rows by (family,
implementation, shape, dtype); the end-to-end record whole when the new run has one. Rows the
new run did not measure stay. The date becomes the new run's, and the command names both runs.
A run on another GPU is not merged: `--supplement` keeps it whole beside the recorded one, and
the report renders it at the end under its own header.
"""

import argparse
import json


# Each kind of row and what identifies it: a new run's row replaces the old ones with its key
# (for ORT rows (op, kind): a partial run that measured an op replaces every old row of it).
_ROW_KEYS = (
    ("criterion", lambda r: r["id"]),
    ("meta", lambda r: r["id"]),
    ("comparison", lambda r: (r["family"], r["implementation"], r["shape"], r["dtype"])),
    ("ort_comparison", lambda r: (r["op"], r.get("kind"))),
)


def _row_keys(by_case):
    """`_ROW_KEYS`, the ORT rows' key with the case when `by_case`."""
    if not by_case:
        return _ROW_KEYS
    return tuple((field, (lambda r: (r["op"], r.get("kind"), r["case"])) if field == "ort_comparison" else key)
                 for field, key in _ROW_KEYS)


def _without(old, new, by_case=False):
    """`old` less the rows `new` measured again."""
    pruned = dict(old)
    for field, key in _row_keys(by_case):
        fresh = {key(r) for r in new.get(field) or []}
        pruned[field] = [r for r in old.get(field) or [] if key(r) not in fresh]
    if new.get("e2e"):
        pruned["e2e"] = {}
    return pruned


def merge(old, new, note, by_case=False):
    """`old` with `new`'s measurements in place of the ones it repeats (both results dicts)."""
    if old.get("gpu") != new.get("gpu"):
        raise ValueError(f"runs on different GPUs ({old.get('gpu')} and {new.get('gpu')}) are not merged")
    merged = _without(old, new, by_case)
    for field, _ in _ROW_KEYS:
        merged[field] = merged[field] + list(new.get(field) or [])
    if new.get("e2e"):
        merged["e2e"] = new["e2e"]
    merged["date"], merged["driver"], merged["torch"] = new["date"], new["driver"], new["torch"]
    merged["command"] = f"{old['command']}; then on {new['date']} ({note}): {new['command']}"
    return merged


def _has_rows(results):
    return any(results.get(f) for f in ("criterion", "comparison", "ort_comparison", "e2e"))


def add_supplement(old, new, note, by_case=False):
    """`old` with `new` (a partial run on another GPU) kept beside it, rendered at the end of the
    report under its own header. A supplement from the same GPU and date takes `new`'s rows in
    place of the ones it repeats (as `merge` does); earlier ones from the same GPU lose the rows
    `new` measured again, and go when none are left."""
    merged = dict(old)
    kept, same_day = [], None
    for s in old.get("supplements", []):
        if s["gpu"] != new["gpu"]:
            kept.append(s)
        elif s["date"] == new["date"]:
            same_day = s
        elif _has_rows(pruned := _without(s, new, by_case)):
            kept.append(pruned)
    if same_day is None:
        supplement = dict(new, note=note)
    else:
        supplement = dict(merge(same_day, new, note, by_case), note=f"{same_day['note']}; {note}")
    merged["supplements"] = kept + [supplement]
    return merged


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("recorded")
    ap.add_argument("new")
    ap.add_argument("--note", required=True, help="what the partial run re-measured (goes into the command line)")
    ap.add_argument("--supplement", action="store_true",
                    help="keep the new run whole beside the recorded one (a run on another GPU) instead of merging rows")
    ap.add_argument("--by-case", action="store_true",
                    help="replace ORT rows per case, not every row of an op the new run measured")
    args = ap.parse_args()
    with open(args.recorded) as f:
        old = json.load(f)
    with open(args.new) as f:
        new = json.load(f)
    with open(args.recorded, "w") as f:
        json.dump((add_supplement if args.supplement else merge)(old, new, args.note, args.by_case), f, indent=1)
    print(f"merged {args.new} into {args.recorded}")


if __name__ == "__main__":
    main()
