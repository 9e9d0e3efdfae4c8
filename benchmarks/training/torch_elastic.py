"""One worker of PyTorch's elastic restart, for benchmarks/training/elastic: DistributedDataParallel
(gloo) on the benchmark's MLP (torch_mlp.py's task, model and Adam), started by torchrun, which
restarts every worker of the node when one fails (--max_restarts). Rank 0 saves the model and
optimizer state after every step (torch.save to a temporary, then os.replace), and every worker
resumes from that file when it starts, as a job that must not lose a step does. Rank 0 appends
"STEP WALL_TIME PID" to --log after each completed step (time.time(), seconds since the epoch;
its process id, which a restart changes).

    python3 -m torch.distributed.run --standalone --nproc_per_node 4 --max_restarts 3 \\
        torch_elastic.py --steps 300 --checkpoint /tmp/ckpt.pt --log /tmp/steps.txt
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_mlp import make_adam, make_model, make_task  # noqa: E402: the benchmark's own


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="784,1024,1024,10")
    parser.add_argument("--per-replica-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    layers = [int(size) for size in args.layers.split(",")]
    global_batch = args.per_replica_batch * world_size
    x, y = make_task(layers[0], layers[-1], global_batch * 64)
    model = make_model(layers)
    optimizer = make_adam(model.parameters(), "foreach", args.learning_rate)
    step = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    trained = torch.nn.parallel.DistributedDataParallel(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    while step < args.steps:
        begin = (step % 64) * global_batch + rank * args.per_replica_batch
        optimizer.zero_grad()
        loss_fn(trained(x[begin:begin + args.per_replica_batch]),
                y[begin:begin + args.per_replica_batch]).backward()
        optimizer.step()
        step += 1
        if rank == 0:
            temporary = args.checkpoint + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step}, temporary)
            os.replace(temporary, args.checkpoint)
            with open(args.log, "a") as log:
                log.write(f"{step} {time.time():.6f} {os.getpid()}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
