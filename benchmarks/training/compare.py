"""The end-to-end comparison of benchmarks/training/run: one model, every system, one run.

Runs every configuration in turn, --repetitions times round-robin (so that a slow moment of the
machine falls on every system alike), and prints, per system and replica count, the median
examples/s with its range, the scaling from 1 to 2 replicas, and whether the final parameters are
bit-identical across replica counts (separate, shorter runs with one global batch). A system
whose program or interpreter is missing is skipped with a message. Standard library only.

Every system trains the same math: the same MLP, per-replica batch, Adam (betas 0.9, 0.999,
epsilon 1e-8) at the same --learning-rate, one core per replica; every process is started with
OPENBLAS_NUM_THREADS=1 and OMP_NUM_THREADS=1 (Debian's PyTorch links an OpenBLAS that keeps two
threads despite torch.set_num_threads(1)). Each peer runs as its own guides run it, and, as a
second row, the way its defaults run it:
    PyTorch     fused=True Adam (foreach=True where the installed torch has no fused CPU Adam:
                Debian's 1.13); second, torch.optim.Adam's default for-loop
    TensorFlow  the custom training loop (a prefetched tf.data pipeline, the strategy's
                distributed data set, strategy.run in a tf.function); second, Keras model.fit
The bits runs use the first rows only.

    compare.py --build BUILD_DIR [--torch-python PY] [--debian-python PY] [--tf-python PY]
               [--layers 784,1024,1024,10] [--per-replica-batch 64] [--learning-rate 1e-3]
               [--steps 200] [--repetitions 3] [--markdown FILE]
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
# Every process of every system, cohort's included: one core per replica. OpenBLAS's pthread build
# ignores torch.set_num_threads and OpenMP's settings, so it is told by its own variable.
ONE_CORE = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


class Row:
    """One configuration: a system at a replica count, and how to run it. `variant` names how a
    peer's loop or optimizer is written ("" for cohort); scaling compares rows of one variant."""

    def __init__(self, system, label, replicas, command, environment=None, variant=""):
        self.system, self.replicas, self.variant, self.base = system, replicas, variant, label
        self.label = f"{label}, {variant}" if variant else label
        self.command, self.environment = command, environment or {}
        self.rates, self.failure = [], None


def run(command, environment, timeout):
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                               env=dict(os.environ, **ONE_CORE, **environment))
    output = completed.stdout + completed.stderr
    for pattern in (COHORT_LINE, PEER_LINE, TABLE_ROW):
        found = pattern.findall(output)
        if found and completed.returncode == 0:
            return int(found[-1][0]), found[-1][1], time.perf_counter() - started
    # The error's own line where there is one (a Python traceback ends in a dump of its values).
    lines = output.strip().splitlines() or ["no output"]
    errors = [line for line in lines if re.match(r"\w*(Error|Exception)\b", line)]
    raise RuntimeError(f"exit {completed.returncode}: {(errors or lines)[-1][:200]}")


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
                      "--examples", str(batch * steps), "--epochs", "1", "--quiet",
                      "--learning-rate", str(args.learning_rate)]
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


def fused_adam(python):
    """Whether `python`'s torch has a fused Adam for CPU tensors (2.4 and later)."""
    probe = ("import torch\np = torch.zeros(2, requires_grad=True)\np.grad = torch.ones(2)\n"
             "torch.optim.Adam([p], fused=True).step()")
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


def torch_rows(python, name, args, per_replica, steps, replica_counts, bits):
    if not peer_available(python, name, ["torch", "numpy"]):
        return []
    # What PyTorch's own tuning advice uses (fused, else foreach), then its default on CPU.
    best = "fused" if fused_adam(python) else "foreach"
    if best != "fused" and not bits:
        print(f"{name}: no fused Adam for CPU tensors in this torch; its first rows use "
              "foreach=True")
    rows = []
    for adam in (best,) if bits else (best, "for-loop"):
        for replicas in replica_counts:
            batch = per_replica or args.bits_batch // replicas
            command = [python, os.path.join(HERE, "torch_mlp.py"), "--layers", args.layers,
                       "--world-size", str(replicas), "--per-replica-batch", str(batch),
                       "--steps", str(steps), "--learning-rate", str(args.learning_rate),
                       "--adam", adam, "--port", str(29610 + replicas)]
            variant = {"fused": "fused Adam", "foreach": "foreach Adam",
                       "for-loop": "Adam's default for-loop"}[adam]
            rows.append(Row(name, ("DDP" if replicas > 1 else "1 process") + f" {replicas}",
                            replicas, command, variant=variant))
    return rows


def tensorflow_rows(python, args, per_replica, steps, bits):
    if not peer_available(python, "TensorFlow", ["tensorflow", "numpy"]):
        return []
    rows = []
    for loop in ("custom",) if bits else ("custom", "fit"):
        for strategy, replicas in (("none", 1), ("mirrored", 2), ("multi_worker", 2)):
            batch = per_replica or args.bits_batch // replicas
            command = [python, os.path.join(HERE, "tf_mlp.py"), "--strategy", strategy,
                       "--loop", loop, "--layers", args.layers, "--world-size", str(replicas),
                       "--per-replica-batch", str(batch), "--steps", str(steps),
                       "--learning-rate", str(args.learning_rate)]
            label = {"none": "no strategy", "mirrored": "MirroredStrategy",
                     "multi_worker": "MultiWorkerMirroredStrategy"}[strategy]
            rows.append(Row("TensorFlow tf.distribute", f"{label} {replicas}", replicas, command,
                            {"TF_CPP_MIN_LOG_LEVEL": "2"},
                            variant={"custom": "custom loop", "fit": "Keras fit"}[loop]))
    return rows


def all_rows(args, per_replica, steps, bits):
    replica_counts = (1, 2, 4) if bits else (1, 2)
    rows = []
    for model in ("eigen", "torch"):
        rows += cohort_rows(args, model, per_replica, steps, replica_counts, bits)
    rows += torch_rows(args.debian_python, "PyTorch (Debian 1.13)", args, per_replica, steps,
                       replica_counts[:2], bits)
    rows += torch_rows(args.torch_python, "PyTorch (PyPI)", args, per_replica, steps,
                       replica_counts[:2], bits)
    rows += tensorflow_rows(args.tf_python, args, per_replica, steps, bits)
    return rows


def measure(rows, repetitions, timeout):
    for repetition in range(repetitions):
        for row in rows:
            if row.failure:
                continue
            try:
                rate, _, seconds = run(row.command, row.environment, timeout)
                row.rates.append(rate)
                print(f"  [{repetition + 1}/{repetitions}] {row.system:24} {row.label:52} "
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
        print(f"  bits {row.system:24} {row.label:52} {parameters}", flush=True)
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
        one = {}  # variant -> the median of its first 1-replica row
        for row in system_rows:
            if row.rates and row.replicas == 1:
                one.setdefault(row.variant, statistics.median(row.rates))
        for index, row in enumerate(system_rows):
            if row.failure or not row.rates:
                lines.append(f"| {system if index == 0 else ''} | {row.label} | failed | | | |")
                continue
            median = statistics.median(row.rates)
            scaling = (f"{median / one[row.variant]:.2f}x"
                       if row.replicas == 2 and row.variant in one else "")
            lines.append(f"| {system if index == 0 else ''} | {row.label} | {median:,.0f} | "
                         f"{min(row.rates):,}-{max(row.rates):,} | {scaling} | "
                         f"{verdict if index == 0 else ''} |")
    return "\n".join(lines)


def flops_per_example(layers):
    """{product kind: FLOPs per example} of a training step of the MLP: each layer's forward product
    and weight gradient, 2 FLOPs per weight each, and its input gradient, 2 per weight, except the
    first layer's, which nothing needs (a "6 per weight" overcounts 784-1024-1024-10 by 17%).
    Biases, activations, the loss and the optimizer are left out: under 0.1% of the FLOPs."""
    weights = [inputs * outputs for inputs, outputs in zip(layers, layers[1:])]
    return {"forward": 2 * sum(weights), "weight_gradient": 2 * sum(weights),
            "input_gradient": 2 * sum(weights[1:])}


def gemm_rates(args):
    """{product kind: FLOP/s} on one core, in the library the Eigen model uses, from its benchmark:
    the median of 5 repetitions of each of the first layer's three products (forward,
    weight_gradient, input_gradient; benchmarks/examples/eigen_mlp_bench.cpp)."""
    bench = os.path.join(args.build, "benchmarks/examples/bench_examples")
    if not os.access(bench, os.X_OK):
        return {}
    completed = subprocess.run([bench, "--benchmark_filter=gemm", "--benchmark_min_time=0.5",
                                "--benchmark_repetitions=5",
                                "--benchmark_report_aggregates_only=true"],
                               capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, **ONE_CORE))
    found = re.findall(r"^gemm/(\w+)/\S*_median\s.*?gflops=([0-9.]+)([kMG]?)/s", completed.stdout,
                       re.M)
    scale = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}  # the counter is in GFLOP/s
    return {kind: float(value) * scale[unit] * 1e9 for kind, value, unit in found}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--torch-python")
    parser.add_argument("--debian-python")
    parser.add_argument("--tf-python")
    parser.add_argument("--layers", default="784,1024,1024,10")
    parser.add_argument("--per-replica-batch", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-3,
                        help="Adam's, for every system (cohort's examples default to 3e-3)")
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
    setting = (f"MLP {args.layers} ({weights + sum(layers[1:]):,} parameters), Adam at learning "
               f"rate {args.learning_rate:g} for every system, {args.per_replica_batch} examples "
               f"per replica per step, one core per replica ("
               + " ".join(f"{name}={value}" for name, value in ONE_CORE.items())
               + f" in every process); {args.steps} timed steps a run (cohort's whole fit, "
               f"the peers' after 10 untimed), {args.repetitions} repetitions, round-robin")
    print(f"model: {setting}")
    rows = all_rows(args, args.per_replica_batch, args.steps, bits=False)
    measure(rows, args.repetitions, args.timeout)
    print(f"\nbits: {args.bits_steps} steps of global batch {args.bits_batch} "
          f"({args.bits_micro_batches} micro-batches for cohort) on 1, 2 and 4 replicas")
    bits = fingerprints(all_rows(args, None, args.bits_steps, bits=True), args.timeout)

    result = table(rows, bits)
    flops = flops_per_example(layers)
    per_example = sum(flops.values())
    gemm = gemm_rates(args)
    eigen_one = [row for row in rows if row.system.startswith("cohort Eigen")
                 and row.label == "Mirrored 1" and row.rates]
    notes = [f"{system}: no fused Adam for CPU tensors in its torch, so its first rows use "
             f"foreach=True" for system in sorted({row.system for row in rows
                                                   if row.variant == "foreach Adam"})]
    notes += [f"FLOPs per example: {per_example / 1e6:.2f} M (forward 2W, weight gradient 2W, "
              f"input gradient 2W for every layer but the first; W: that layer's weights)"]
    if eigen_one and set(flops) <= set(gemm):
        # The time the model's products would take, each at the rate of its kind, over their FLOPs:
        # the rate the model could reach if nothing but its products took time.
        shapes = per_example / sum(flops[kind] / gemm[kind] for kind in flops)
        model_rate = statistics.median(eigen_one[0].rates) * per_example
        notes.append(
            f"single-core GEMM rate for the model's products: {shapes / 1e9:.1f} GFLOP/s, the "
            f"FLOP-weighted harmonic mean of forward {gemm['forward'] / 1e9:.1f}, weight gradient "
            f"{gemm['weight_gradient'] / 1e9:.1f} and input gradient "
            f"{gemm['input_gradient'] / 1e9:.1f} GFLOP/s (bench_examples, the library the Eigen "
            f"model uses, median of 5; its products are the first layer's, each standing for "
            f"every layer's product of its kind); the Eigen model on 1 replica computes "
            f"{model_rate / 1e9:.1f} GFLOP/s ({100 * model_rate / shapes:.0f}% of it)")
    medians = {(row.system, row.base, row.variant): statistics.median(row.rates)
               for row in rows if row.rates}

    def ratios(left, system, base):
        """cohort's `left` (system, label) over every variant of a peer's `base` row, in order."""
        found = [f"{medians[left + ('',)] / median:.2f}x ({variant})"
                 for (peer, label, variant), median in medians.items()
                 if peer == system and label == base]
        return f"{left[0]} {left[1]} / {system} {base}: " + (
            ", ".join(found) if left + ("",) in medians and found else "n/a")

    pypi, debian, tf = "PyTorch (PyPI)", "PyTorch (Debian 1.13)", "TensorFlow tf.distribute"
    eigen, torch = "cohort Eigen MLP", "cohort LibTorch MLP"
    notes += [
        ratios((eigen, "Mirrored 1"), pypi, "1 process 1"),
        ratios((eigen, "Mirrored 2"), pypi, "DDP 2"),
        ratios((eigen, "MultiWorkerMirrored 2"), pypi, "DDP 2"),
        ratios((eigen, "Mirrored 2"), tf, "MirroredStrategy 2"),
        ratios((eigen, "MultiWorkerMirrored 2"), tf, "MultiWorkerMirroredStrategy 2"),
        ratios((torch, "Mirrored 1"), debian, "1 process 1") + " (the same libtorch)",
        ratios((torch, "MultiWorkerMirrored 2"), debian, "DDP 2") + " (the same libtorch)",
    ]
    notes += [f"{row.system} {row.label} failed: {row.failure}" for row in rows if row.failure]
    print("\n" + result + "\n\n" + "\n".join(notes))
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write(setting + ":\n\n" + result + "\n\n"
                      + "\n".join(f"- {note}" for note in notes) + "\n")


if __name__ == "__main__":
    sys.exit(main())
