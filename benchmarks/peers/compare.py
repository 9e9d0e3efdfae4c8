#!/usr/bin/env python3
"""Reads the JSON reports of one benchmarks/peers/run and prints cohort against its peers.

    compare.py RESULTS_DIR [--dat DIR]

Every report is cohort-bench's JSON (tools/cohort-bench/report.hpp) or a peer's in the same
schema. A series measured in several rounds (NAME.r1.json, NAME.r2.json, ... from
PEERS_ROUNDS) counts with the median of its rounds at each size, and a ratio is the median of
the ratios within each round, whose series ran minutes apart at most: a slow spell of a shared
machine then moves neither. Three tables, per process count and message size:

  1. busbw in GB/s of every series, in place (every library's native form: cohort,
     MPI_IN_PLACE, Gloo's ring and torch all reduce in place);
  2. busbw ratios cohort / peer, in place, for cohort tcp deterministic, cohort tcp ring, cohort
     tcp deterministic without frame checksums (tcp-nocs), cohort shm (deterministic, its
     all-reduce through shared memory) and cohort local against every peer: above 1 cohort is
     faster, below 1 slower. A ratio of busbw at equal size and rank count is the inverse ratio
     of times;
  3. the same ratios out of place (input and output apart; nccl-tests' first column).

The last rows of tables 2 and 3 are geometric means over small (<= 64 KiB) and large (>= 1 MiB)
sizes. With --dat, writes one gnuplot data file per series and process count, in place
(plot.gp reads them). Standard library only.
"""

import argparse
import json
import math
import pathlib
import re
import statistics
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


PLACEMENTS = ("in_place", "out_of_place")


def load(directory):
    """(name, ranks) -> {size: {placement: {round: busbw}}}"""
    series = {}
    for path in sorted(pathlib.Path(directory).glob("*.json")):
        numbered = re.search(r"\.r(\d+)\.json$", path.name)
        round_number = int(numbered.group(1)) if numbered else 1
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            print("compare.py: skipping %s: %s" % (path, error), file=sys.stderr)
            continue
        if "results" not in report or "backend" not in report:
            continue
        points = series.setdefault((series_name(report), report["ranks"]), {})
        for row in report["results"]:
            rounds = points.setdefault(row["size_bytes"], {p: {} for p in PLACEMENTS})
            for placement in PLACEMENTS:
                rounds[placement][round_number] = row[placement]["busbw_gbps"]
    return series


def placed(series, placement):
    """(name, ranks) -> {size: median busbw over the rounds} for one placement."""
    return {key: {size: statistics.median(rounds[placement].values())
                  for size, rounds in points.items()}
            for key, points in series.items()}


def paired_ratio(mine, theirs):
    """The median over the rounds both have of mine / theirs ({round: busbw} each), or None."""
    ratios = [mine[r] / theirs[r] for r in mine if r in theirs and mine[r] and theirs[r]]
    return statistics.median(ratios) if ratios else None


def rounds_of(series):
    counts = {len(r[p]) for points in series.values() for r in points.values() for p in r}
    return "%d" % min(counts) if len(counts) == 1 else "%d to %d" % (min(counts), max(counts))


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


def print_ratios(series, ranks_list, placement):
    peers = sorted({name for name, _ in series if not name.startswith("cohort")},
                   key=lambda n: list(PEER_SHORT).index(n) if n in PEER_SHORT else 99)
    cohorts = [COHORT_NAMES[c] for c in COHORT if any(n == COHORT_NAMES[c] for n, _ in series)]
    if not peers or not cohorts:
        print("# no peer or no cohort results: nothing to compare")
        return
    width = 9
    group = width * len(peers)
    print("# busbw ratio cohort / peer, %s (above 1: cohort faster)" % placement.replace("_", "-"))
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
                    mine = series.get((c, ranks), {}).get(size, {}).get(placement, {})
                    theirs = series.get((p, ranks), {}).get(size, {}).get(placement, {})
                    ratio = paired_ratio(mine, theirs)
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
    print("# rounds per series: %s (each busbw the median of its rounds, each ratio the median of the"
          " ratios within a round)" % rounds_of(series))
    in_place = placed(series, "in_place")
    print_busbw(in_place, ranks_list)
    print_ratios(series, ranks_list, "in_place")
    print_ratios(series, ranks_list, "out_of_place")
    if args.dat:
        write_dat(in_place, args.dat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
