"""PyTorch DistributedDataParallel on the demo's model, for comparison with cohort.

The same MLP as examples/common/mlp.hpp (8-128-10, ReLU, softmax cross-entropy), Adam with the
same learning rate, the same per-replica batch, trained on the same kind of task (Gaussian blobs:
10 classes x 8 blobs in 8 dimensions, spread 0.4) for one epoch of 100,000 examples, with 1 and 2
processes (gloo backend over 127.0.0.1). Every process uses one thread (torch.set_num_threads(1)),
as every cohort replica is one thread. Prints one line per world size:
    ddp world_size=N examples_per_second=X
and the BLAS PyTorch was built with.
"""
import os
import re
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

EXAMPLES = 100_000
FEATURES, CLASSES, BLOBS, SPREAD = 8, 10, 8, 0.4
PER_REPLICA_BATCH = 256


def make_task(seed=1):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CLASSES * BLOBS, FEATURES)).astype(np.float32)
    blob = rng.integers(0, CLASSES * BLOBS, EXAMPLES)
    x = centres[blob] + SPREAD * rng.standard_normal((EXAMPLES, FEATURES)).astype(np.float32)
    y = (blob // BLOBS).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def worker(rank, world_size, port, results):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(1)
    x, y = make_task()
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, CLASSES))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=3e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    order = torch.randperm(EXAMPLES, generator=torch.Generator().manual_seed(1))
    global_batch = PER_REPLICA_BATCH * world_size
    steps = EXAMPLES // global_batch
    dist.barrier()
    start = time.perf_counter()
    for step in range(steps):
        begin = step * global_batch + rank * PER_REPLICA_BATCH
        index = order[begin:begin + PER_REPLICA_BATCH]
        optimizer.zero_grad()
        loss_fn(ddp(x[index]), y[index]).backward()
        optimizer.step()
    dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        results.put(steps * global_batch / seconds)
    dist.destroy_process_group()


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 29610
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    print(f"torch {torch.__version__}, BLAS_INFO={blas.group(1) if blas else 'unknown'}, "
          f"libblas.so.3 -> {os.path.realpath('/usr/lib/x86_64-linux-gnu/libblas.so.3')}")
    context = mp.get_context("spawn")
    for world_size in (1, 2):
        results = context.Queue()
        mp.spawn(worker, args=(world_size, port + world_size, results), nprocs=world_size)
        print(f"ddp world_size={world_size} examples_per_second={results.get():.0f}")


if __name__ == "__main__":
    main()
