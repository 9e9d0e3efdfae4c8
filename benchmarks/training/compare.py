"""The end-to-end comparison of benchmarks/training/run: one model, every system, one run.

Runs every configuration in turn, --repetitions times round-robin (so that a slow moment of the
machine falls on every system alike), and prints, per system and replica count, the median
examples/s with its range, the scaling from 1 to 2 replicas, and whether the final parameters are
bit-identical across replica counts (separate, shorter runs with one global batch). A system
whose program or interpreter is missing is skipped with a message. Standard library only.

    compare.py --build BUILD_DIR [--torch-python PY] [--debian-python PY] [--tf-python PY]
               [--layers 784,1024,1024,10] [--per-replica-batch 64] [--steps 200]
               [--repetitions 3] [--markdown FILE]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# What the programs print: cohort's examples end with
#   "<label>: N examples/s, held-out accuracy A%, parameters HEX"
# and the peers' scripts with "examples_per_second=N parameters=HEX".
COHORT_LINE = re.compile(r": (\d+) examples/s, held-out accuracy [0-9.]+%, parameters ([0-9a-f]+)")
PEER_LINE = re.compile(r"examples_per_second=(\d+) parameters=([0-9a-f]+)")
# examples/00_mirrored_cpu's table: "replicas examples/s speedup accuracy parameters".
TABLE_ROW = re.compile(r"^\s*\d+\s+(\d+)\s+[0-9.]+x\s+[0-9.]+%\s+([0-9a-f]+)\s*$", re.M)


class Row:
    """One configuration: a system at a replica count, and how to run it."""

    def __init__(self, system, label, replicas, command, environment=None):
        self.system, self.label, self.replicas = system, label, replicas
        self.command, self.environment = command, environment or {}
        self.rates, self.failure = [], None


def run(command, environment, timeout):
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                               env=dict(os.environ, **environment))
    output = completed.stdout + completed.stderr
    for pattern in (COHORT_LINE, PEER_LINE, TABLE_ROW):
        found = pattern.findall(output)
        if found and completed.returncode == 0:
            return int(found[-1][0]), found[-1][1], time.perf_counter() - started
    tail = "\n".join(output.strip().splitlines()[-5:])
    raise RuntimeError(f"exit {completed.returncode}: {tail}")


def cohort_rows(args, model, per_replica, steps, replica_counts, bits):
    """cohort's configurations for `model` (eigen or torch); per_replica=None: a fixed global
    batch (args.bits_batch) split over the replicas, for the bits runs."""
    build = args.build
    run_tool = os.path.join(build, "tools/cohort-run/cohort-run")
    programs = {
        "eigen": (os.path.join(build, "examples/00_mirrored_cpu/mirrored_cpu"),
                  os.path.join(build, "examples/02_multi_worker/multi_worker"),
                  os.path.join(build, "examples/03_parameter_server/parameter_server")),
        "torch": (os.path.join(build, "examples/05_libtorch/libtorch"),) * 3,
    }[model]
    mirrored, multi_worker, parameter_server = programs
    if not all(os.access(program, os.X_OK) for program in programs):
        print(f"skipped: cohort with the {model} model ({programs[0]} not built)")
        return []
    system = f"cohort {'Eigen' if model == 'eigen' else 'LibTorch'} MLP"
    rows = []
    for kind in ("Mirrored", "MultiWorkerMirrored") + (("ParameterServer<Sync>",) if bits else ()):
        for replicas in replica_counts:
            if kind == "ParameterServer<Sync>" and replicas != 2:
                continue
            batch = per_replica * replicas if per_replica else args.bits_batch
            micro = replicas if per_replica else args.bits_micro_batches
            common = ["--layers", args.layers, "--batch", str(batch), "--micro-batches", str(micro),
                      "--examples", str(batch * steps), "--epochs", "1", "--quiet"]
            if model == "torch":
                common += ["--model", "mlp", "--intra-op-threads", "1", "--strategy",
                           {"Mirrored": "mirrored", "MultiWorkerMirrored": "multi_worker",
                            "ParameterServer<Sync>": "parameter_server"}[kind]]
            else:
                common += ["--threads", "1"]
            if kind == "Mirrored":
                command = [mirrored, "--replicas", str(replicas)] + common
            elif kind == "MultiWorkerMirrored":
                command = [run_tool, "--np", str(replicas), "--", multi_worker] + common
            else:
                command = [run_tool, "--np", "2", "--ps", "2", "--", parameter_server] + common
            rows.append(Row(system, f"{kind} {replicas}", replicas, command))
            if kind == "MultiWorkerMirrored" and replicas > 1:
                # The processes share this host, so they all-reduce through shared memory: the
                # same over TCP beside it.
                rows.append(Row(system, f"{kind} {replicas}, over TCP", replicas, command,
                                {"COHORT_SHARED_MEMORY": "0"}))
    return rows


def peer_available(python, name, modules):
    """Whether `python` imports `modules`; says why not when it does not."""
    if not python or not shutil.which(python):
        print(f"skipped: {name} (no interpreter {python})")
        return False
    probe = subprocess.run([python, "-c", "import " + ", ".join(modules)], capture_output=True)
    if probe.returncode != 0:
        print(f"skipped: {name} ({' or '.join(modules)} does not import in {python})")
        return False
    return True


def torch_rows(python, name, args, per_replica, steps, replica_counts):
    if not peer_available(python, name, ["torch", "numpy"]):
        return []
    rows = []
    for replicas in replica_counts:
        batch = per_replica or args.bits_batch // replicas
        command = [python, os.path.join(HERE, "torch_mlp.py"), "--layers", args.layers,
                   "--world-size", str(replicas), "--per-replica-batch", str(batch),
                   "--steps", str(steps), "--port", str(29610 + replicas)]
        rows.append(Row(name, ("DDP" if replicas > 1 else "1 process") + f" {replicas}", replicas,
                        command))
    return rows


def tensorflow_rows(python, args, per_replica, steps):
    if not peer_available(python, "TensorFlow", ["tensorflow", "numpy"]):
        return []
    rows = []
    for strategy, replicas in (("none", 1), ("mirrored", 2), ("multi_worker", 2)):
        batch = per_replica or args.bits_batch // replicas
        command = [python, os.path.join(HERE, "tf_mlp.py"), "--strategy", strategy,
                   "--layers", args.layers, "--world-size", str(replicas),
                   "--per-replica-batch", str(batch), "--steps", str(steps)]
        label = {"none": "no strategy", "mirrored": "MirroredStrategy",
                 "multi_worker": "MultiWorkerMirroredStrategy"}[strategy]
        rows.append(Row("TensorFlow tf.distribute", f"{label} {replicas}", replicas, command,
                        {"TF_CPP_MIN_LOG_LEVEL": "2"}))
    return rows


def all_rows(args, per_replica, steps, bits):
    replica_counts = (1, 2, 4) if bits else (1, 2)
    rows = []
    for model in ("eigen", "torch"):
        rows += cohort_rows(args, model, per_replica, steps, replica_counts, bits)
    rows += torch_rows(args.debian_python, "PyTorch (Debian 1.13)", args, per_replica, steps,
                       replica_counts[:2])
    rows += torch_rows(args.torch_python, "PyTorch (PyPI)", args, per_replica, steps,
                       replica_counts[:2])
    rows += tensorflow_rows(args.tf_python, args, per_replica, steps)
    return rows


def measure(rows, repetitions, timeout):
    for repetition in range(repetitions):
        for row in rows:
            if row.failure:
                continue
            try:
                rate, _, seconds = run(row.command, row.environment, timeout)
                row.rates.append(rate)
                print(f"  [{repetition + 1}/{repetitions}] {row.system:28} {row.label:26} "
                      f"{rate:>9} examples/s ({seconds:.0f} s)", flush=True)
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                row.failure = str(error)
                print(f"  FAILED {row.system} {row.label}: {error}", flush=True)


def fingerprints(rows, timeout):
    """system -> {label: parameters} of the bits runs."""
    found = {}
    for row in rows:
        try:
            _, parameters, _ = run(row.command, row.environment, timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            parameters = "failed"
            print(f"  FAILED (bits) {row.system} {row.label}: {error}", flush=True)
        found.setdefault(row.system, {})[row.label] = parameters
        print(f"  bits {row.system:28} {row.label:26} {parameters}", flush=True)
    return found


def table(rows, bits):
    lines = ["| system | configuration | examples/s (median) | range | scaling 1 to 2 | "
             "same bits across replica counts |", "| --- | --- | --- | --- | --- | --- |"]
    by_system = {}
    for row in rows:
        by_system.setdefault(row.system, []).append(row)
    for system, system_rows in by_system.items():
        prints = bits.get(system, {})
        identical = len(set(prints.values())) == 1 and "failed" not in prints.values()
        verdict = (f"{'yes' if identical else 'no'} ({len(prints)} runs: "
                   + ", ".join(sorted(prints)) + ")") if prints else "not measured"
        one = {}
        for row in system_rows:
            if row.rates:
                one.setdefault(row.replicas, statistics.median(row.rates))
        for index, row in enumerate(system_rows):
            if row.failure or not row.rates:
                lines.append(f"| {system} | {row.label} | failed | | | |")
                continue
            median = statistics.median(row.rates)
            scaling = (f"{median / one[1]:.2f}x" if row.replicas == 2 and 1 in one else "")
            lines.append(f"| {system if index == 0 else ''} | {row.label} | {median:,.0f} | "
                         f"{min(row.rates):,}-{max(row.rates):,} | {scaling} | "
                         f"{verdict if index == 0 else ''} |")
    return "\n".join(lines)


def gemm_rate(args):
    """The single-core GEMM rate of the library the Eigen model uses, from its benchmark."""
    bench = os.path.join(args.build, "benchmarks/examples/bench_examples")
    if not os.access(bench, os.X_OK):
        return None
    completed = subprocess.run([bench, "--benchmark_filter=gemm", "--benchmark_min_time=1"],
                               capture_output=True, text=True, timeout=300)
    found = re.findall(r"gflops=([0-9.]+)([kMG]?)", completed.stdout)
    if not found:
        return None
    scale = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}  # the counter is in GFLOP/s
    return max(float(value) * scale[unit] * 1e9 for value, unit in found)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--torch-python")
    parser.add_argument("--debian-python")
    parser.add_argument("--tf-python")
    parser.add_argument("--layers", default="784,1024,1024,10")
    parser.add_argument("--per-replica-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--bits-batch", type=int, default=256)
    parser.add_argument("--bits-micro-batches", type=int, default=4)
    parser.add_argument("--bits-steps", type=int, default=20)
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--markdown")
    args = parser.parse_args()

    layers = [int(size) for size in args.layers.split(",")]
    weights = sum(a * b for a, b in zip(layers, layers[1:]))
    print(f"model: MLP {args.layers} ({weights + sum(layers[1:]):,} parameters), Adam, "
          f"{args.per_replica_batch} examples per replica per step, one intra-op thread per "
          f"replica; {args.steps} steps a run, {args.repetitions} repetitions, round-robin")
    rows = all_rows(args, args.per_replica_batch, args.steps, bits=False)
    measure(rows, args.repetitions, args.timeout)
    print(f"\nbits: {args.bits_steps} steps of global batch {args.bits_batch} "
          f"({args.bits_micro_batches} micro-batches for cohort) on 1, 2 and 4 replicas")
    bits = fingerprints(all_rows(args, None, args.bits_steps, bits=True), args.timeout)

    result = table(rows, bits)
    flops = 6 * weights  # per example: forward 2, backward 4 multiply-adds per weight
    gemm = gemm_rate(args)
    eigen_one = [row for row in rows if row.system.startswith("cohort Eigen")
                 and row.label == "Mirrored 1" and row.rates]
    notes = []
    if gemm and eigen_one:
        model_rate = statistics.median(eigen_one[0].rates) * flops
        notes.append(f"single-core GEMM rate (the Eigen model's library, dominant shape): "
                     f"{gemm / 1e9:.1f} GFLOP/s; the Eigen model on 1 replica computes "
                     f"{model_rate / 1e9:.1f} GFLOP/s ({100 * model_rate / gemm:.0f}% of it)")
    medians = {(row.system, row.label): statistics.median(row.rates) for row in rows if row.rates}

    def ratio(left, right):
        if left in medians and right in medians:
            return f"{medians[left] / medians[right]:.2f}x"
        return "n/a"

    pypi, debian, tf = "PyTorch (PyPI)", "PyTorch (Debian 1.13)", "TensorFlow tf.distribute"
    eigen, torch = "cohort Eigen MLP", "cohort LibTorch MLP"
    notes += [
        f"Eigen 1 replica / PyTorch PyPI 1 process: {ratio((eigen, 'Mirrored 1'), (pypi, '1 process 1'))}",
        f"Eigen Mirrored 2 / DDP 2 (PyPI): {ratio((eigen, 'Mirrored 2'), (pypi, 'DDP 2'))}; "
        f"Eigen MultiWorkerMirrored 2 / DDP 2 (PyPI): "
        f"{ratio((eigen, 'MultiWorkerMirrored 2'), (pypi, 'DDP 2'))}",
        f"Eigen Mirrored 2 / TF MultiWorkerMirroredStrategy 2: "
        f"{ratio((eigen, 'Mirrored 2'), (tf, 'MultiWorkerMirroredStrategy 2'))}; Eigen "
        f"MultiWorkerMirrored 2 / TF MultiWorkerMirroredStrategy 2: "
        f"{ratio((eigen, 'MultiWorkerMirrored 2'), (tf, 'MultiWorkerMirroredStrategy 2'))}",
        f"LibTorch MultiWorkerMirrored 2 / DDP 2 on the same libtorch (Debian 1.13): "
        f"{ratio((torch, 'MultiWorkerMirrored 2'), (debian, 'DDP 2'))}",
    ]
    print("\n" + result + "\n\n" + "\n".join(notes))
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write(result + "\n\n" + "\n".join(f"- {note}" for note in notes) + "\n")


if __name__ == "__main__":
    sys.exit(main())
