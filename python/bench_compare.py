"""Compares two results.json files of scripts/gpu-bench.sh, row by row: every dlkern time (criterion
medians and C ABI graph replays) of the new run against the same row of the old one, with each
run's fastest baseline beside it, so that a change of machine state (a baseline that moved too)
can be told from a change of dlkern.

    python python/bench_compare.py OLD.json NEW.json [--worse 1.03]

Prints the rows whose new time is more than --worse times the old (and whose baseline did not
move by as much), then a summary; exits 1 if any row is worse.
"""

import argparse
import json
import sys


def rows(results):
    """(family, dtype, shape, implementation) -> time in us, dlkern's and the baselines'."""
    meta = {m["id"]: m for m in results["meta"]}
    out = {}
    for c in results["criterion"]:
        m = meta.get(c["id"])
        if m and m["family"] != "ceilings":
            out[(m["family"], m["dtype"], m["shape"], m["implementation"] + " (criterion)")] = c["median_ns"] / 1e3
    for r in results["comparison"]:
        out[(r["family"], r["dtype"], r["shape"], r["implementation"])] = r["time_us"]
    return out


def best_baseline(table, family, dtype, shape):
    times = [t for (f, d, s, i), t in table.items() if (f, d, s) == (family, dtype, shape) and not i.startswith("dlkern")]
    return min(times) if times else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--worse", type=float, default=1.03, help="slowdown that counts as worse (default 1.03)")
    args = ap.parse_args()
    old, new = (rows(json.load(open(p))) for p in (args.old, args.new))
    worse, compared, missing = [], 0, []
    for key, t_new in sorted(new.items()):
        if not key[3].startswith("dlkern"):
            continue
        t_old = old.get(key)
        if t_old is None:
            missing.append(key)
            continue
        compared += 1
        b_old, b_new = best_baseline(old, *key[:3]), best_baseline(new, *key[:3])
        drift = b_new / b_old if b_old and b_new else 1.0
        if t_new > args.worse * t_old and t_new / t_old > drift * args.worse:
            worse.append((key, t_old, t_new, drift))
    for (family, dtype, shape, impl), t_old, t_new, drift in worse:
        print(f"WORSE {family} {dtype} {shape} {impl}: {t_old:.2f} -> {t_new:.2f} us ({t_new / t_old:.3f}x; baseline {drift:.3f}x)")
    gone = [k for k in old if k[3].startswith("dlkern") and k not in new]
    print(f"{compared} rows compared, {len(worse)} worse by more than {args.worse}x, {len(missing)} new rows, {len(gone)} rows gone")
    for key in gone:
        print("gone:", " ".join(key))
    sys.exit(1 if worse else 0)


if __name__ == "__main__":
    main()
