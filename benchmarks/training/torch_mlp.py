"""PyTorch on the benchmark's MLP: one process, or DistributedDataParallel (gloo over 127.0.0.1).

The model of benchmarks/training/run: an MLP with the given layer sizes, ReLU between layers,
softmax cross-entropy, Adam, trained on a generated task of Gaussian blobs. Every process uses
one intra-op thread (torch.set_num_threads(1)), as every cohort replica of the comparison does;
with Debian's build, whose OpenBLAS keeps its own thread count, the caller also sets
OPENBLAS_NUM_THREADS=1 (compare.py does, for every system).

    torch_mlp.py --layers 784,1024,1024,10 --world-size 2 --per-replica-batch 64 --steps 200 \
                 --adam fused --learning-rate 1e-3

--adam picks torch.optim.Adam's implementation, all of them the same update:
    fused     fused=True, one kernel over all parameters: what to use where the installed torch
              has it for CPU tensors (2.4 and later); an error where it has not
    foreach   foreach=True, multi-tensor operations (torch 1.13 has no fused CPU Adam)
    for-loop  torch's default on CPU: one parameter at a time, several operations each, which
              costs a third of this model's step

--compress bf16 or fp16 registers DDP's communication hook of that name: each bucket is cast to the
narrow type, all-reduced, and divided by the world size, so its bits change with the world size.

or, across hosts, one process per rank started by hand (gloo over MASTER_ADDR, e.g. one per network
namespace):

    torch_mlp.py --world-size 2 --rank R --master-addr 10.0.0.1 ...

The first (or only) process prints one line:
    torch VERSION blas=NAME adam=IMPLEMENTATION world_size=N examples_per_second=X parameters=HEX
where HEX is a SHA-256 prefix of the final parameters' bytes (the order of model.parameters()),
so two runs can be compared bit for bit. The first --warmup steps are not timed.
"""
import argparse
import hashlib
import os
import re
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def make_task(features, classes, examples, seed=1, blobs=8, spread=0.4):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes * blobs, features)).astype(np.float32)
    blob = rng.integers(0, classes * blobs, examples)
    x = centres[blob] + spread * rng.standard_normal((examples, features)).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy((blob // blobs).astype(np.int64))


def fingerprint(parameters):
    digest = hashlib.sha256()
    for parameter in parameters:
        digest.update(parameter.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def blas_name():
    config = torch.__config__.show()
    found = re.search(r"BLAS_INFO=(\w+)", config)
    name = found.group(1) if found else "unknown"
    if name in ("generic", "open"):  # Debian's build: whatever libblas.so.3 points to
        name += ":" + os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    return name


def make_adam(parameters, implementation, learning_rate):
    """torch.optim.Adam with its defaults (betas 0.9, 0.999, eps 1e-8, as cohort's Adam), in the
    named implementation; only the speed differs."""
    choice = {"fused": {"fused": True}, "foreach": {"foreach": True},
              "for-loop": {"foreach": False}}[implementation]
    return torch.optim.Adam(parameters, lr=learning_rate, **choice)


def make_model(layers):
    """The MLP: Linear layers of the given sizes, ReLU between them, initialized from seed 1."""
    torch.manual_seed(1)
    modules = []
    for index in range(len(layers) - 1):
        modules.append(torch.nn.Linear(layers[index], layers[index + 1]))
        if index + 2 < len(layers):
            modules.append(torch.nn.ReLU())
    return torch.nn.Sequential(*modules)


def worker(rank, args, results):
    torch.set_num_threads(1)
    world_size = args.world_size
    if world_size > 1:
        os.environ["MASTER_ADDR"] = args.master_addr
        os.environ["MASTER_PORT"] = str(args.port)
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    layers = [int(size) for size in args.layers.split(",")]
    per_replica = args.per_replica_batch
    global_batch = per_replica * world_size
    steps = args.warmup + args.steps
    x, y = make_task(layers[0], layers[-1], max(global_batch * steps, global_batch))
    model = make_model(layers)
    trained = torch.nn.parallel.DistributedDataParallel(model) if world_size > 1 else model
    if world_size > 1 and args.compress != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        trained.register_comm_hook(None, getattr(default_hooks, f"{args.compress}_compress_hook"))
    optimizer = make_adam(trained.parameters(), args.adam, args.learning_rate)
    loss_fn = torch.nn.CrossEntropyLoss()
    start = None
    for step in range(steps):
        if step == args.warmup:
            if world_size > 1:
                dist.barrier()
            start = time.perf_counter()
        begin = step * global_batch + rank * per_replica
        optimizer.zero_grad()
        loss_fn(trained(x[begin:begin + per_replica]), y[begin:begin + per_replica]).backward()
        optimizer.step()
    if world_size > 1:
        dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        results.put((args.steps * global_batch / seconds, fingerprint(model.parameters())))
    if world_size > 1:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="784,1024,1024,10")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--per-replica-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--adam", choices=["fused", "foreach", "for-loop"], default="fused",
                        help="torch.optim.Adam's implementation (the docstring says which)")
    parser.add_argument("--compress", choices=["none", "bf16", "fp16"], default="none",
                        help="DDP's gradient compression hook (bf16_compress_hook, "
                             "fp16_compress_hook): gradients all-reduced at half the bytes")
    parser.add_argument("--port", type=int, default=29610)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--rank", type=int, help="run this rank only (the others elsewhere)")
    args = parser.parse_args()
    context = mp.get_context("spawn")
    results = context.Queue()
    if args.world_size == 1 or args.rank is not None:
        worker(args.rank or 0, args, results)
        if args.rank:
            return
    else:
        mp.spawn(worker, args=(args, results), nprocs=args.world_size)
    rate, parameters = results.get()
    print(f"torch {torch.__version__} blas={blas_name()} adam={args.adam} compress={args.compress} "
          f"world_size={args.world_size} "
          f"examples_per_second={rate:.0f} parameters={parameters}")


if __name__ == "__main__":
    main()
