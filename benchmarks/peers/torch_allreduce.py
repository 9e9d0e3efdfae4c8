#!/usr/bin/env python3
"""torch.distributed all_reduce (gloo backend, float32, sum), measured as cohort-bench measures.

    cohort-run --np 4 -- python3 torch_allreduce.py -b 4 -e 64M -f 4 --json out.json
    torchrun --standalone --nproc_per_node=4 torch_allreduce.py -b 4 -e 64M -f 4 --json out.json

benchmarks/peers/run starts it with cohort-run (Debian's torchrun 1.13 fails on Python 3.11), only
with a Python that can import torch. Under cohort-run it takes torch.distributed's variables from
cohort's (COHORT_RANK, COHORT_WORLD_SIZE, COHORT_MASTER_ADDR, COHORT_MASTER_PORT). The procedure is
tools/cohort-bench/sweep.hpp's: nccl-tests' warm-up, then per size and placement one untimed call,
a barrier, iters calls each timed by its rank, the slowest rank's time per iteration (a MAX
all_reduce), and one checked call on cohort-bench's exact sum pattern. Out-of-place is a copy and
the in-place call. Rank 0 writes the JSON in cohort-bench's schema (the fields compare.py reads and
the table's figures).
"""

import argparse
import json
import math
import os
import socket
import time

import torch
import torch.distributed as dist


def parse_bytes(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    scale = units.get(text[-1:].lower(), 1)
    number = text[:-1] if scale != 1 else text
    return int(float(number) * scale)


def percentile(values, p):
    ordered = sorted(values)
    index = max(1, min(len(ordered), math.ceil(p / 100.0 * len(ordered))))
    return ordered[index - 1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-b", default="32M")
    parser.add_argument("-e", default="32M")
    parser.add_argument("-f", type=int, default=2)
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("-w", type=int, default=5)
    parser.add_argument("-c", type=int, default=1)
    parser.add_argument("--json", default="")
    args = parser.parse_args()

    for torch_name, cohort_name in (("RANK", "COHORT_RANK"), ("WORLD_SIZE", "COHORT_WORLD_SIZE"),
                                    ("MASTER_ADDR", "COHORT_MASTER_ADDR"),
                                    ("MASTER_PORT", "COHORT_MASTER_PORT")):
        if torch_name not in os.environ and cohort_name in os.environ:
            os.environ[torch_name] = os.environ[cohort_name]
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    sizes, s = [], parse_bytes(args.b)
    while s <= parse_bytes(args.e):
        sizes.append(s)
        s *= args.f
    largest = sizes[-1] // 4
    send = torch.zeros(max(largest, 1), dtype=torch.float32)
    receive = torch.zeros(max(largest, 1), dtype=torch.float32)

    def call(count, in_place):
        out = receive[:count]
        if not in_place:
            out.copy_(send[:count])
        dist.all_reduce(out, op=dist.ReduceOp.SUM)

    for nbytes in (sizes[-1], sizes[0]):
        for _ in range(args.w):
            call(nbytes // 4, False)

    factor = 2.0 * (size - 1) / size
    results, total_busbw = [], 0.0
    out_of_bounds = 0
    for nbytes in sizes:
        count = nbytes // 4
        row = {"size_bytes": count * 4, "count": count, "type": "float", "redop": "sum",
               "root": -1}
        for placement, in_place in (("out_of_place", False), ("in_place", True)):
            send[:count].zero_()
            receive[:count].zero_()
            call(count, in_place)
            dist.barrier()
            seconds = torch.zeros(args.n, dtype=torch.float64)
            for i in range(args.n):
                start = time.perf_counter()
                call(count, in_place)
                seconds[i] = time.perf_counter() - start
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            wrong, ranks_wrong = -1, 0
            if args.c:
                index = torch.arange(count, dtype=torch.int64)
                pattern = ((index * 7 + rank * 3) % 9 - 4).to(torch.float32)
                expected = sum(((index * 7 + r * 3) % 9 - 4) for r in range(size)).to(
                    torch.float32)
                receive[:count].fill_(99.0)
                (receive if in_place else send)[:count].copy_(pattern)
                call(count, in_place)
                bad = int((receive[:count] != expected).sum())
                counts = torch.tensor([bad, 1 if bad else 0], dtype=torch.float64)
                dist.all_reduce(counts, op=dist.ReduceOp.SUM)
                wrong, ranks_wrong = int(counts[0]), int(counts[1])
                out_of_bounds += ranks_wrong
            us = [float(x) * 1e6 for x in seconds]
            mean = sum(us) / len(us)
            algbw = row["size_bytes"] / 1e9 / (mean / 1e6) if mean > 0 else 0.0
            total_busbw += algbw * factor
            row[placement] = {"time_us": mean, "algbw_gbps": algbw, "busbw_gbps": algbw * factor,
                              "p50_us": percentile(us, 50), "p99_us": percentile(us, 99),
                              "wrong": wrong, "ranks_wrong": ranks_wrong, "iterations_us": us}
        results.append(row)
        if rank == 0:
            o, p = row["out_of_place"], row["in_place"]
            print("%12d  %12d  %8s  %6s  %6d  %7.1f  %6.2f  %6.2f  %5d  %7.1f  %6.2f  %6.2f  %5d"
                  % (row["size_bytes"], count, "float", "sum", -1, o["time_us"], o["algbw_gbps"],
                     o["busbw_gbps"], o["wrong"], p["time_us"], p["algbw_gbps"],
                     p["busbw_gbps"], p["wrong"]), flush=True)
    if rank == 0:
        average = total_busbw / (2 * len(results)) if results else 0.0
        verdict = "FAILED" if out_of_bounds else "OK"
        print("# Out of bounds values : %d %s" % (out_of_bounds, verdict))
        print("# Avg bus bandwidth    : %g" % average)
        if args.json:
            report = {"tool": "peer_torch_allreduce", "collective": "all_reduce",
                      "backend": "torch", "algorithm": "gloo", "ranks": size,
                      "details": "torch %s, torch.distributed gloo backend" % torch.__version__,
                      "launcher": "torchrun", "datatype": "float", "op": "sum", "root": -1,
                      "machine": {"hostname": socket.gethostname(), "cores": os.cpu_count()},
                      "results": results, "out_of_bounds": out_of_bounds,
                      "avg_busbw_gbps": average, "ok": out_of_bounds == 0}
            with open(args.json, "w") as out:
                json.dump(report, out, indent=2)
    dist.destroy_process_group()
    return 1 if out_of_bounds else 0


if __name__ == "__main__":
    raise SystemExit(main())
