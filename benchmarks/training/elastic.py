"""What an elastic job costs: cohort's elastic MultiWorkerMirrored against itself without elastic,
and a lost worker's time in cohort against torchrun's elastic restart of PyTorch DDP.

Run by benchmarks/training/elastic, which builds the programs and installs Debian's PyTorch. Every
job trains the benchmark's MLP (784-1024-1024-10, Adam, a global batch of 128) with one intra-op
thread per process, on this host:

  no failure    examples/02_multi_worker under cohort-run, 2 workers through shared memory and 2
                over TCP, and examples/03_parameter_server under consistency sync, 2 workers and
                a server (whose chunks keep their parameters from before their last update when
                elastic), each with and without COHORT_MIN_WORKERS=1, --rounds rounds with the
                series in turn (--series picks some), the plain job first in even rounds and the
                elastic one first in odd rounds; the median examples/s of each (and its range)
                and the ratio elastic / plain, and the median of each round's ratio with its 95%
                interval (a bootstrap of the rounds: 10,000 resamples, seeded), of examples/s and
                of the CPU seconds the job's processes took, the launcher's included
  a failure     4 workers, worker 3 SIGKILLed --kill-after seconds into the fit, --kills times:
    cohort      cohort-run --np 4 --min-np 3, COHORT_TRACE: from the chief's timeline, the time
                from the kill to the end of the first step completed after it, less the median
                step after it (what a step costs anyway); and the regroup span alone. Again over
                TCP (COHORT_SHARED_MEMORY=0), where this MLP's gradient is under the size from
                which the workers share the update, so each holds the whole state. Again with
                --max-restarts 1, the worker started again and taken back: that time plus the
                span of the change that took it back (the fit stands still for both), and the
                time from the kill to 4 workers again. Both again for example 03 under
                consistency sync with a server (cohort-run --np 4 --ps 1 --min-np 3)
    torchrun    python3 -m torch.distributed.run --standalone --nproc_per_node 4 --max_restarts 3
                of torch_elastic.py (DDP over gloo, the state saved after every step and loaded
                when a worker starts): the same time, from rank 0's log of completed steps, to the
                first step of the restarted workers; every worker of the node is restarted, then
                resumes from the file
  state kept    with --keep-share N: N elastic fits of 2 workers under COHORT_TRACE on each
                path, from each worker's timeline, what keeping the state every 16 steps took as
                a share of its "step" spans, which hold it: what keeping costs a fit without
                failures, measured without the noise between two fits. Over TCP, sharing the
                update (COHORT_SHARE_UPDATE_FROM=0), the "state kept" spans (the optimizer state
                gathered and the copy made); through shared memory, where each worker writes its
                stripes into its shared buffer inside the update of every 16th step, what those
                "optimizer" spans took beyond the median of the others; and the same measure of
                a fit that keeps nothing (not elastic), whose updates differ by nothing but noise
  soak          with --soak N: fits of 4 workers (a smaller MLP, 8-256-256-10) under cohort-run
                --min-np 2 --max-restarts 1, each with a random worker SIGKILLed at a random point
                and started again by cohort-run, rank 0 included, until N kills landed in the
                middle of a fit (3N fits at most), every one checked for exit status 0 and the
                fingerprint of the uninterrupted fit, and whether the worker started again was
                taken back before the fit ended; a fit still running after 120 s counts as a hang
  cycles        with --cycles N: one long fit of 4 workers of that MLP under cohort-run --min-np 3
                --max-restarts N, in which a random worker other than rank 1 (rank 0 included) is
                SIGKILLed N times, each time once cohort-run has started the last one again and the
                job has taken it back; rank 1 lives through them all, and its open descriptors and
                resident memory are read after each cycle (as are cohort-run's descriptors) and at
                the fit's end, beside the chief's at the end of the same elastic fit without
                kills. The fit ends with that fit's fingerprint, or the run says
                which cycle went wrong; a cycle not taken back within 60 s counts as a hang
"""
import argparse
import json
import os
import random
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = ["--layers", "784,1024,1024,10", "--batch", "128", "--micro-batches", "4",
         "--threads", "1", "--no-validation", "--quiet"]


def environment(**extra):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env.update({name: str(value) for name, value in extra.items()})
    return env


def descendant_with(pid, entry):
    """The descendant process of `pid` whose environment holds `entry`, or None."""
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as children:
                kids = [int(kid) for kid in children.read().split()]
        except OSError:
            continue
        for kid in kids:
            try:
                with open(f"/proc/{kid}/environ", "rb") as env:
                    if entry.encode() in env.read().split(b"\0"):
                        return kid
            except OSError:
                pass
            pending.append(kid)
    return None


def cohort_rate(build, workers, elastic, shared_memory, examples, servers=0):
    program = ([f"{build}/examples/03_parameter_server/parameter_server", "--consistency", "sync"]
               if servers else [f"{build}/examples/02_multi_worker/multi_worker"])
    command = [f"{build}/tools/cohort-run/cohort-run", "--np", str(workers), "--ps",
               str(servers), "--", *program, *MODEL, "--examples", str(examples), "--epochs", "1"]
    if not servers:
        command[3:5] = []
    extra = {"COHORT_SHARED_MEMORY": int(shared_memory)}
    if elastic:
        extra["COHORT_MIN_WORKERS"] = 1
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    output = subprocess.run(command, env=environment(**extra), capture_output=True, text=True,
                            timeout=600, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return float(re.search(r"([0-9.]+) examples/s", output).group(1)), cpu


def median_interval(values, resamples=10000):
    """The 95% interval of the median of `values`: a percentile bootstrap, seeded, so that the
    same rounds give the same interval."""
    draw = random.Random(0)
    medians = sorted(statistics.median(draw.choices(values, k=len(values)))
                     for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def by_round(name, measure, plain, elastic):
    """The line of `measure`'s ratio elastic / plain by round: each round's pair ran one after the
    other, so the median of their ratios moves less with the machine's drift between rounds."""
    paired = [e / p for p, e in zip(plain, elastic)]
    low, high = median_interval(paired)
    return (f"{name}: {measure}, elastic / plain by round, median {statistics.median(paired):.3f}"
            f" (95% interval {low:.3f} to {high:.3f}; rounds {min(paired):.3f} to"
            f" {max(paired):.3f})")


def keep_share(build, fits, examples):
    """The share of the step time each worker of an elastic fit spends keeping the state, from
    the timelines of `fits` fits of each path: a line per fit and worker, then the medians."""
    every = 16  # KeptStripes::kEvery
    for path in ("tcp", "shm", "shm, not elastic"):
        shares = []
        for fit in range(fits):
            with tempfile.TemporaryDirectory() as trace:
                command = [f"{build}/tools/cohort-run/cohort-run", "--np", "2", "--",
                           f"{build}/examples/02_multi_worker/multi_worker", *MODEL, "--examples",
                           str(examples), "--epochs", "1"]
                extra = ({"COHORT_SHARED_MEMORY": 0, "COHORT_SHARE_UPDATE_FROM": 0}
                         if path == "tcp" else {"COHORT_SHARED_MEMORY": 1})
                if path != "shm, not elastic":
                    extra["COHORT_MIN_WORKERS"] = 1
                subprocess.run(command, env=environment(COHORT_TRACE=trace, **extra),
                               capture_output=True, text=True, timeout=600, check=True)
                for worker in range(2):
                    with open(os.path.join(trace, f"worker-{worker}.json")) as file:
                        spans = [event for event in json.load(file)["traceEvents"]
                                 if event.get("ph") == "X"]
                    steps = sum(span["dur"] for span in spans if span["name"] == "step")
                    if path == "tcp":
                        kept = [span["dur"] for span in spans if span["name"] == "state kept"]
                        cost = sum(kept)
                    else:
                        # The stripes are kept inside the update of every 16th step: what those
                        # updates took beyond the median of the others.
                        updates = [span for span in spans if span["name"] == "optimizer"]
                        kept = [span["dur"] for span in updates
                                if (span["args"]["step"] + 1) % every == 0]
                        others = [span["dur"] for span in updates
                                  if (span["args"]["step"] + 1) % every != 0]
                        cost = sum(kept) - len(kept) * statistics.median(others)
                    shares.append(cost / steps)
                    print(f"{path}, fit {fit}, worker {worker}: {len(kept)} steps keeping, "
                          f"{cost / 1e3:.1f} ms of {steps / 1e3:.1f} ms of steps: "
                          f"{100 * shares[-1]:.2f}%", flush=True)
        print(f"state kept, {path}: median {100 * statistics.median(shares):.2f}% of the step "
              f"time ({100 * min(shares):.2f}% to {100 * max(shares):.2f}%)", flush=True)


def kill_worker_at(process, rank_entry, kill_after):
    """Sleeps kill_after seconds, SIGKILLs the descendant of `process` with `rank_entry`; the
    kill's wall time."""
    time.sleep(kill_after)
    victim = descendant_with(process.pid, rank_entry)
    if victim is None:
        raise RuntimeError(f"no worker with {rank_entry} to kill")
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    return killed


def cohort_failure(build, kill_after, examples, restart=False, servers=0, shared_memory=True):
    with tempfile.TemporaryDirectory() as trace:
        restarts = ["--max-restarts", "1"] if restart else []
        program = ([f"{build}/examples/03_parameter_server/parameter_server", "--consistency",
                    "sync"] if servers else [f"{build}/examples/02_multi_worker/multi_worker"])
        command = [f"{build}/tools/cohort-run/cohort-run", "--np", "4", "--ps", str(servers),
                   "--min-np", "3", *restarts, "--", *program, *MODEL, "--examples",
                   str(examples), "--epochs", "3"]
        process = subprocess.Popen(command, env=environment(
                                       COHORT_TRACE=trace, COHORT_SHARED_MEMORY=int(shared_memory)),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        killed = kill_worker_at(process, "COHORT_RANK=3", kill_after)
        output, _ = process.communicate(timeout=600)
        if process.returncode != 0 or "workers 4 -> 3" not in output or (
                restart and "workers 3 -> 4" not in output):
            raise RuntimeError("the elastic job did not go on, or took nobody back:\n" + output)
        with open(os.path.join(trace, "worker-0.json")) as file:
            events = json.load(file)["traceEvents"]
    spans = [event for event in events if event.get("ph") == "X"]
    regroups = sorted((span for span in spans if span["name"] == "regroup"),
                      key=lambda span: span["ts"])
    regroup = regroups[0]
    steps = sorted((span for span in spans if span["name"] == "step"),
                   key=lambda span: span["ts"])
    ends = [(span["ts"] + span["dur"]) / 1e6 for span in steps]
    regrouped = (regroup["ts"] + regroup["dur"]) / 1e6
    after = [end for end in ends if end > regrouped]
    durations = [span["dur"] / 1e6 for span in steps if span["ts"] / 1e6 > regrouped]
    result = {"lost": after[0] - killed - statistics.median(durations),
              "regroup": regroup["dur"] / 1e6, "detected": regroup["ts"] / 1e6 - killed}
    if restart:  # the second change took the worker back: the fit stood still for it too
        rejoin = regroups[1]
        result["rejoin"] = rejoin["dur"] / 1e6
        result["whole"] = (rejoin["ts"] + rejoin["dur"]) / 1e6 - killed
    return result


def torch_failure(python, kill_after):
    with tempfile.TemporaryDirectory() as work:
        log = os.path.join(work, "steps.txt")
        # --redirects 1 --tee 1: Debian's torch 1.13 under Python 3.11 cannot parse the default
        # (0: nothing redirected), so each worker's stdout goes to a file under --log_dir too.
        command = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
                   "--max_restarts", "3", "--redirects", "1", "--tee", "1", "--log_dir",
                   os.path.join(work, "logs"), os.path.join(HERE, "torch_elastic.py"),
                   "--steps", "1000000", "--checkpoint", os.path.join(work, "state.pt"),
                   "--log", log]
        process = subprocess.Popen(command, env=environment(), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            # kill_after seconds into the fit, as for cohort: torch's workers take seconds to
            # import it on a small machine before their first step.
            deadline = time.time() + 300
            while not os.path.exists(log) and time.time() < deadline:
                time.sleep(0.1)
            killed = kill_worker_at(process, "RANK=3", kill_after)
            deadline = time.time() + 300
            after = []
            while time.time() < deadline and len(after) < 20:
                time.sleep(0.5)
                with open(log) as file:
                    completed = [line.split() for line in file if line.strip()]
                before = [pid for _, wall, pid in completed if float(wall) < killed]
                # Steps of the restarted workers: rank 0's process is a new one.
                after = [float(wall) for _, wall, pid in completed
                         if float(wall) > killed and before and pid != before[-1]]
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if len(after) < 20:
        raise RuntimeError("torchrun's job did not go on after the kill")
    steps = [b - a for a, b in zip(after[1:], after[2:])]
    return {"lost": after[0] - killed - statistics.median(steps)}


SOAK_MODEL = ["--layers", "8,256,256,10", "--examples", "20000", "--epochs", "4", "--batch",
              "128", "--micro-batches", "8", "--threads", "1", "--no-validation", "--quiet"]


def fingerprint_of(output):
    found = re.search(r"parameters ([0-9a-f]+)", output)
    return found.group(1) if found else None


def soak(build, runs):
    """Returns the number of fits that ended otherwise than with the uninterrupted bits."""
    program = [f"{build}/examples/02_multi_worker/multi_worker", *SOAK_MODEL]
    launcher = f"{build}/tools/cohort-run/cohort-run"
    start = time.time()
    reference = fingerprint_of(subprocess.run([launcher, "--np", "4", "--", *program],
                                              env=environment(), capture_output=True, text=True,
                                              timeout=600, check=True).stdout)
    duration = time.time() - start
    print(f"\nsoak: {runs} fits of 4 workers, one SIGKILLed at random and started again; "
          f"uninterrupted: {reference} in {duration:.1f} s")
    print("| fit | worker killed | after (s) | went on | taken back | parameters | |")
    print("| ---: | --- | ---: | --- | --- | --- | --- |")
    wrong = 0
    landed = 0
    rejoined = 0
    fits = 0
    while landed < runs and fits < 3 * runs:
        fits += 1
        victim = random.randrange(4)
        delay = random.uniform(0.05, 0.6) * duration
        process = subprocess.Popen([launcher, "--np", "4", "--min-np", "2", "--max-restarts", "1",
                                    "--", *program],
                                   env=environment(), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        try:
            kill_worker_at(process, f"COHORT_RANK={victim}", delay)
            output, _ = process.communicate(timeout=120)
            parameters = fingerprint_of(output)
            verdict = "same" if process.returncode == 0 and parameters == reference else "WRONG"
        except subprocess.TimeoutExpired:
            process.kill()
            output, parameters, verdict = process.communicate()[0], None, "HANG"
        except RuntimeError:  # the fit ended before the kill
            output, _ = process.communicate(timeout=120)
            parameters, verdict = fingerprint_of(output), "ended first"
        wrong += verdict in ("WRONG", "HANG")
        went_on = "workers 4 -> 3" in output
        taken_back = "workers 3 -> 4" in output
        landed += went_on
        rejoined += taken_back
        print(f"| {fits} | rank {victim} | {delay:.2f} | {went_on} | {taken_back} | {parameters} | "
              f"{verdict} |")
        sys.stdout.flush()
    print(f"kills in the middle of a fit: {landed}, of which taken back: {rejoined}; wrong or hung: "
          f"{wrong} of {fits} fits")
    return wrong


CYCLES_MODEL = ["--layers", "8,256,256,10", "--batch", "128", "--micro-batches", "8", "--threads",
                "1", "--no-validation", "--quiet"]


def usage_of(pid):
    """Process `pid`'s open descriptors and resident KiB: in all (VmRSS), of its own (RssAnon) and
    of shared memory (RssShmem)."""
    with open(f"/proc/{pid}/status") as status:
        fields = dict(line.split(":", 1) for line in status if line.startswith(("VmRSS", "Rss")))
    usage = {name: int(fields[name].split()[0]) for name in ("VmRSS", "RssAnon", "RssShmem")}
    usage["descriptors"] = len(os.listdir(f"/proc/{pid}/fd"))
    return usage


class LastMemory(threading.Thread):
    """Reads the usage (usage_of) of the process of rank `rank` under cohort-run `launcher` every
    0.2 s until it ends; `last` is the last reading (its final size)."""

    def __init__(self, launcher, rank):
        super().__init__(daemon=True)
        self.launcher = launcher
        self.rank = rank
        self.last = None

    def run(self):
        while self.launcher.poll() is None:
            observer = descendant_with(self.launcher.pid, f"COHORT_RANK={self.rank}")
            try:
                if observer is not None:
                    self.last = usage_of(observer)
            except (OSError, KeyError):
                pass
            time.sleep(0.2)


def memory_text(reading):
    return (f"{reading['VmRSS']} KiB resident ({reading['RssAnon']} of its own, "
            f"{reading['RssShmem']} shared), {reading['descriptors']} descriptors")


def cycles(build, count):
    """Returns whether the fit ended with the uninterrupted bits and every cycle was taken back."""
    launcher = f"{build}/tools/cohort-run/cohort-run"
    # About 2.5 s of fit per cycle (0.6 s an epoch at 4 workers on 2 cores): the kills end well
    # before the fit.
    program = [f"{build}/examples/02_multi_worker/multi_worker", *CYCLES_MODEL, "--examples",
               "20000", "--epochs", str(8 + 4 * count)]
    start = time.time()
    # The same elastic job without kills: its chief holds what rank 1 holds once it is the chief
    # (the door, the fit's records), and its shared buffer keeps the stripes too.
    uninterrupted = subprocess.Popen([launcher, "--np", "4", "--min-np", "3", "--", *program],
                                     env=environment(), stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
    uninterrupted_memory = LastMemory(uninterrupted, 0)
    uninterrupted_memory.start()
    reference = fingerprint_of(uninterrupted.communicate(timeout=3600)[0])
    uninterrupted_memory.join()
    print(f"\ncycles: {count} kills of a random worker but rank 1 in one fit of 4 workers, each "
          f"started again and taken back; uninterrupted: {reference} in {time.time() - start:.1f} s")
    process = subprocess.Popen([launcher, "--np", "4", "--min-np", "3", "--max-restarts",
                                str(count), "--", *program], env=environment(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    taken_back = threading.Semaphore(0)

    def read():
        for line in process.stdout:
            lines.append(line)
            if "workers 3 -> 4" in line:
                taken_back.release()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    final_memory = LastMemory(process, 1)
    final_memory.start()
    observer = None
    while observer is None and process.poll() is None:
        time.sleep(0.2)
        observer = descendant_with(process.pid, "COHORT_RANK=1")
    time.sleep(2.0)  # the job formed, its first steps taken
    baseline = usage_of(observer)
    launcher_baseline = usage_of(process.pid)["descriptors"]
    print(f"rank 1 before the first kill: {baseline['descriptors']} descriptors, "
          f"{baseline['VmRSS']} KiB resident; "
          f"cohort-run: {launcher_baseline} descriptors")
    print("| cycle | worker killed | taken back after (s) | rank 1 descriptors | rank 1 KiB | "
          "cohort-run descriptors |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    done = 0
    failure = ""
    samples = []
    chief_lost = False
    for cycle in range(1, count + 1):
        victim_rank = random.choice([0, 2, 3])
        chief_lost = chief_lost or victim_rank == 0
        victim = descendant_with(process.pid, f"COHORT_RANK={victim_rank}")
        if victim is None or process.poll() is not None:
            failure = f"cycle {cycle}: the fit ended, or no worker of rank {victim_rank} ran"
            break
        time.sleep(random.uniform(0.0, 0.5))  # a random point of a step
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        if not taken_back.acquire(timeout=60):
            failure = f"cycle {cycle}: HANG, rank {victim_rank} not taken back within 60 s"
            break
        back = time.time() - killed
        time.sleep(0.3)  # the step after the change
        usage = usage_of(observer)
        launcher_usage = usage_of(process.pid)["descriptors"]
        samples.append(usage)
        done = cycle
        if cycle <= 3 or cycle % 10 == 0 or cycle == count:
            print(f"| {cycle} | rank {victim_rank} | {back:.2f} | {usage['descriptors']} | "
                  f"{usage['VmRSS']} | {launcher_usage} |")
            sys.stdout.flush()
    try:
        process.wait(timeout=3600)
    except subprocess.TimeoutExpired:
        process.kill()
        failure = failure or "HANG: the fit did not end"
    reader.join(timeout=10)
    final_memory.join()
    output = "".join(lines)
    parameters = fingerprint_of(output)
    same = process.returncode == 0 and parameters == reference
    if samples:
        print(f"rank 1 after {done} cycles: descriptors {baseline['descriptors']} -> "
              f"{samples[-1]['descriptors']} (most {max(s['descriptors'] for s in samples)}), "
              f"resident KiB {baseline['VmRSS']} -> {samples[-1]['VmRSS']} "
              f"(most {max(s['VmRSS'] for s in samples)})")
    # A leak grows with the cycles; what the first cycles allocate once (a new membership's
    # buffers, the allocator's arenas) does not.
    if len(samples) >= 20:
        later = range(10, len(samples))
        resident = [samples[i]["VmRSS"] for i in later]
        slope = statistics.linear_regression(list(later), resident).slope
        print(f"rank 1's resident memory from cycle 11 to {len(samples)}: {slope:+.2f} KiB per "
              f"cycle (least squares), {samples[10]['VmRSS']} -> {samples[-1]['VmRSS']} KiB")
    # The chief's records grow with the fit's steps (Report::loss, a double per step): the same
    # fit without kills tells them apart from what the cycles keep.
    if final_memory.last and uninterrupted_memory.last:
        role = " (the chief since rank 0 was first lost)" if chief_lost else ""
        print(f"rank 1{role} at the fit's end: "
              f"{memory_text(final_memory.last)}; the chief of the same fit without kills: "
              f"{memory_text(uninterrupted_memory.last)}")
    print(f"parameters {parameters}: {'the same' if same else 'WRONG'} (exit "
          f"{process.returncode}); {failure or f'all {done} cycles taken back'}")
    with tempfile.NamedTemporaryFile("w", prefix="cohort-cycles-", suffix=".log",
                                     delete=False) as kept:
        kept.write(output)
    print(f"the job's output: {kept.name}")
    return same and not failure


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--torch-python", default="")
    parser.add_argument("--rounds", type=int, default=5, help="0: measure the failures only")
    parser.add_argument("--series", default="shm,tcp,ps",
                        help="the no-failure series to run: shm, tcp, ps (comma-separated)")
    parser.add_argument("--kills", type=int, default=3, help="0: measure no failure")
    parser.add_argument("--kill-after", type=float, default=4.0)
    parser.add_argument("--examples", type=int, default=25600)
    parser.add_argument("--soak", type=int, default=0, help="fits with a random kill; 0: none")
    parser.add_argument("--keep-share", type=int, default=0,
                        help="traced elastic fits of each path for the share of keeping; 0: none")
    parser.add_argument("--cycles", type=int, default=0,
                        help="kill-and-rejoin cycles in one fit; 0: none")
    args = parser.parse_args()
    if args.soak > 0:
        sys.exit(1 if soak(args.build, args.soak) else 0)
    if args.cycles > 0:
        sys.exit(0 if cycles(args.build, args.cycles) else 1)
    if args.keep_share > 0:
        keep_share(args.build, args.keep_share, args.examples)
        return

    if args.rounds > 0:  # 0: the failures only
        print("no failure: examples/s, median of", args.rounds, "rounds")
        named = {"shm": ("2 workers, shared memory", 2, True, 0),
                 "tcp": ("2 workers, TCP", 2, False, 0),
                 "ps": ("2 workers and a server, sync parameter server", 2, False, 1)}
        series = [named[key] for key in args.series.split(",")]
        rates = {(name, elastic): [] for name, *_ in series for elastic in (False, True)}
        cpu = {key: [] for key in rates}
        for round_ in range(args.rounds):
            for name, workers, shared, servers in series:
                # Each order in half the rounds: what runs second in a pair is not always the same.
                for elastic in ((False, True) if round_ % 2 == 0 else (True, False)):
                    rate, seconds = cohort_rate(args.build, workers, elastic, shared,
                                                args.examples, servers)
                    rates[(name, elastic)].append(rate)
                    cpu[(name, elastic)].append(seconds)
        pairs = []
        print("| job | plain (range) | elastic (range) | elastic / plain |")
        print("| --- | ---: | ---: | ---: |")
        for name, *_ in series:
            plain, elastic = rates[(name, False)], rates[(name, True)]
            ratio = statistics.median(elastic) / statistics.median(plain)
            print(f"| {name} | {statistics.median(plain):,.0f} ({min(plain):,.0f}-{max(plain):,.0f})"
                  f" | {statistics.median(elastic):,.0f} ({min(elastic):,.0f}-{max(elastic):,.0f})"
                  f" | {ratio:.3f} |")
            pairs.append(by_round(name, "examples/s", plain, elastic))
            # The CPU every process of the job took (the launcher's included): on a host whose
            # cores the job keeps busy, what an elastic job costs in the cores' time. It includes
            # the job's start, and spreads as much as examples/s here (docs/benchmarks.md).
            pairs.append(by_round(name, "CPU seconds per fit", cpu[(name, False)],
                                  cpu[(name, True)]))
        print("\n".join(pairs))
        sys.stdout.flush()
    if args.kills == 0:
        return

    print(f"\na worker SIGKILLed {args.kill_after} s into a fit of 4 workers, {args.kills} times:")
    print("| system | time lost per failure (s), each | median |")
    print("| --- | --- | ---: |")
    cohort = [cohort_failure(args.build, args.kill_after, args.examples) for _ in range(args.kills)]
    print("| cohort, elastic (cohort-run --min-np 3) | " +
          ", ".join(f"{run['lost']:.3f}" for run in cohort) +
          f" | {statistics.median(run['lost'] for run in cohort):.3f} |")
    tcp = [cohort_failure(args.build, args.kill_after, args.examples, shared_memory=False)
           for _ in range(args.kills)]
    print("| cohort, elastic over TCP (COHORT_SHARED_MEMORY=0) | " +
          ", ".join(f"{run['lost']:.3f}" for run in tcp) +
          f" | {statistics.median(run['lost'] for run in tcp):.3f} |")
    again = [cohort_failure(args.build, args.kill_after, args.examples, restart=True)
             for _ in range(args.kills)]
    print("| cohort, the worker started again (--max-restarts 1): lost + its rejoin | " +
          ", ".join(f"{run['lost']:.3f} + {run['rejoin']:.3f}" for run in again) +
          f" | {statistics.median(run['lost'] + run['rejoin'] for run in again):.3f} |")
    ps = [cohort_failure(args.build, args.kill_after, args.examples, servers=1)
          for _ in range(args.kills)]
    print("| cohort, elastic sync parameter server, 1 server (--ps 1 --min-np 3) | " +
          ", ".join(f"{run['lost']:.3f}" for run in ps) +
          f" | {statistics.median(run['lost'] for run in ps):.3f} |")
    ps_again = [cohort_failure(args.build, args.kill_after, args.examples, True, servers=1)
                for _ in range(args.kills)]
    print("| cohort, the same, the worker started again: lost + its rejoin | " +
          ", ".join(f"{run['lost']:.3f} + {run['rejoin']:.3f}" for run in ps_again) +
          f" | {statistics.median(run['lost'] + run['rejoin'] for run in ps_again):.3f} |")
    if args.torch_python:
        torch = [torch_failure(args.torch_python, args.kill_after) for _ in range(args.kills)]
        print("| PyTorch DDP, torchrun --max_restarts, state saved every step | " +
              ", ".join(f"{run['lost']:.3f}" for run in torch) +
              f" | {statistics.median(run['lost'] for run in torch):.3f} |")
    print("\ncohort's regroup spans (s): " +
          ", ".join(f"{run['regroup']:.3f}" for run in cohort) +
          "; from the kill to the regroup's start (s): " +
          ", ".join(f"{run['detected']:.3f}" for run in cohort) +
          "; over TCP, the regroup spans (s): " +
          ", ".join(f"{run['regroup']:.3f}" for run in tcp) +
          "; with the worker started again, from the kill to 4 workers again (s): " +
          ", ".join(f"{run['whole']:.3f}" for run in again) +
          "; the parameter server's regroup spans (s): " +
          ", ".join(f"{run['regroup']:.3f}" for run in ps) +
          "; from the kill to its regroup's start (s): " +
          ", ".join(f"{run['detected']:.3f}" for run in ps) +
          "; with the worker started again, from the kill to 4 workers again (s): " +
          ", ".join(f"{run['whole']:.3f}" for run in ps_again))


if __name__ == "__main__":
    main()
