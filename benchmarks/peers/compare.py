#!/usr/bin/env python3
"""Reads the JSON reports of one benchmarks/peers/run and prints cohort against its peers.

    compare.py RESULTS_DIR [--dat DIR]

Every report is cohort-bench's JSON (tools/cohort-bench/report.hpp) or a peer's in the same
schema. Two tables, per process count and message size, from the in-place column (every library's
native form: cohort, MPI_IN_PLACE, Gloo's ring and torch all reduce in place):

  1. busbw in GB/s of every series;
  2. busbw ratios cohort / peer for cohort tcp deterministic, cohort tcp ring, cohort tcp
     deterministic without frame checksums (tcp-nocs), cohort shm (deterministic, its all-reduce
     through shared memory) and cohort local
     against every peer: above 1 cohort is faster, below 1 slower. A ratio of busbw at equal size
     and rank count is the inverse ratio of times.

The last rows of table 2 are geometric means over small (<= 64 KiB) and large (>= 1 MiB) sizes.
With --dat, writes one gnuplot data file per series and process count (plot.gp reads them).
Standard library only.
"""

import argparse
import json
import math
import pathlib
import sys

COHORT = [("tcp", "deterministic"), ("tcp", "ring"), ("tcp", "deterministic, no checksum"),
          ("shm", "deterministic"), ("local", "threads")]
COHORT_NAMES = {
    ("tcp", "deterministic"): "cohort tcp deterministic",
    ("tcp", "ring"): "cohort tcp ring",
    ("tcp", "deterministic, no checksum"): "cohort tcp deterministic, no checksum",
    ("shm", "deterministic"): "cohort shm",
    ("local", "threads"): "cohort local",
}
PEER_SHORT = {"openmpi vader": "mpi-shm", "openmpi tcp": "mpi-tcp", "gloo ring": "gloo",
              "torch gloo": "torch"}
SHORT = dict(PEER_SHORT, **{"cohort tcp deterministic": "tcp-det", "cohort tcp ring": "tcp-ring",
                            "cohort tcp deterministic, no checksum": "tcp-nocs",
                            "cohort shm": "shm", "cohort local": "local"})
SMALL = 64 * 1024
LARGE = 1024 * 1024


def series_name(report):
    # Frames without checksums (--checksum 0) are a series of their own: Open MPI's TCP checks
    # nothing beyond TCP's own sum, so that series shows what cohort's checksums cost beside it.
    checksums_off = "frame checksums off" in report.get("details", "")
    key = (report["backend"], report["algorithm"] + (", no checksum" if checksums_off else ""))
    if report.get("tool") == "cohort-bench":
        return COHORT_NAMES.get(key, "cohort %s %s" % key)
    return "%s %s" % key


def load(directory):
    series = {}  # (name, ranks) -> {size: (busbw, time_us)}
    for path in sorted(pathlib.Path(directory).glob("*.json")):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            print("compare.py: skipping %s: %s" % (path, error), file=sys.stderr)
            continue
        if "results" not in report or "backend" not in report:
            continue
        points = {}
        for row in report["results"]:
            points[row["size_bytes"]] = row["in_place"]["busbw_gbps"]
        series[(series_name(report), report["ranks"])] = points
    return series


def geomean(values):
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def human(size):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale and size % scale == 0:
            return "%d%s" % (size // scale, unit)
    return str(size)


def fmt(value, width=8, digits=2):
    if value is None:
        return "-".rjust(width)
    if value != 0 and abs(value) < 0.01:
        return ("%.1e" % value).rjust(width)
    return ("%.*f" % (digits, value)).rjust(width)


def print_busbw(series, ranks_list):
    order = list(COHORT_NAMES.values()) + list(PEER_SHORT)
    names = sorted({name for name, _ in series},
                   key=lambda n: (order.index(n) if n in order else len(order), n))
    print("# busbw (GB/s), in-place: cohort tcp-det(erministic), tcp-ring, tcp-nocs (tcp-det "
          "without frame checksums), shm (shared memory), local;")
    print("# peers mpi-shm (Open MPI, btl vader), mpi-tcp (Open MPI, btl tcp), gloo (Gloo ring, "
          "tcp),")
    print("# torch (torch.distributed gloo)")
    print("#  np      size" + "".join(SHORT.get(n, n).rjust(10) for n in names))
    for ranks in ranks_list:
        sizes = sorted({s for (n, r), p in series.items() if r == ranks for s in p})
        for size in sizes:
            cells = []
            for name in names:
                value = series.get((name, ranks), {}).get(size)
                cells.append(fmt(value, 10, 3))
            print("%5d  %8s%s" % (ranks, human(size), "".join(cells)))
    print("#")


def print_ratios(series, ranks_list):
    peers = sorted({name for name, _ in series if not name.startswith("cohort")},
                   key=lambda n: list(PEER_SHORT).index(n) if n in PEER_SHORT else 99)
    cohorts = [COHORT_NAMES[c] for c in COHORT if any(n == COHORT_NAMES[c] for n, _ in series)]
    if not peers or not cohorts:
        print("# no peer or no cohort results: nothing to compare")
        return
    width = 9
    group = width * len(peers)
    print("# busbw ratio cohort / peer, in-place (above 1: cohort faster)")
    print("#              " + "".join(("| " + c).ljust(group + 2) for c in cohorts))
    print("#  np      size" + "".join(
        "| " + "".join(PEER_SHORT.get(p, p).rjust(width) for p in peers) for _ in cohorts))
    summary = {}
    for ranks in ranks_list:
        sizes = sorted({s for (n, r), p in series.items() if r == ranks for s in p})
        for size in sizes:
            line = "%5d  %8s" % (ranks, human(size))
            for c in cohorts:
                line += "| "
                for p in peers:
                    mine = series.get((c, ranks), {}).get(size)
                    theirs = series.get((p, ranks), {}).get(size)
                    ratio = mine / theirs if mine and theirs else None
                    summary.setdefault((ranks, c, p), []).append((size, ratio))
                    line += fmt(ratio, width)
            print(line)
    for label, keep in (("small", lambda s: s <= SMALL), ("large", lambda s: s >= LARGE)):
        for ranks in ranks_list:
            line = "%5d  %8s" % (ranks, label)
            for c in cohorts:
                line += "| "
                for p in peers:
                    ratios = [r for s, r in summary.get((ranks, c, p), []) if keep(s)]
                    line += fmt(geomean(ratios), width)
            print(line)
    print("# small: geometric mean over sizes <= 64K; large: over sizes >= 1M")
    print("#")


def write_dat(series, directory):
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("np*-*.dat"):
        old.unlink()
    for (name, ranks), points in series.items():
        path = directory / ("np%d-%s.dat" % (ranks, name.replace(",", "").replace(" ", "_")))
        with path.open("w") as out:
            out.write('size "%s"\n' % name)
            for size in sorted(points):
                if size > 0:
                    out.write("%d %.9g\n" % (size, max(points[size], 1e-9)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--dat", help="write gnuplot data files here")
    args = parser.parse_args()
    series = load(args.results)
    if not series:
        print("compare.py: no reports in %s" % args.results, file=sys.stderr)
        return 1
    ranks_list = sorted({r for _, r in series})
    print_busbw(series, ranks_list)
    print_ratios(series, ranks_list)
    if args.dat:
        write_dat(series, args.dat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
