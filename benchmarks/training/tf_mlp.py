"""TensorFlow's tf.distribute on the benchmark's MLP.

The model of benchmarks/training/run (ReLU MLP, softmax cross-entropy, Adam, Gaussian blobs),
written as a Keras model trained by a custom loop (strategy.run over a distributed data set), the
way tf.distribute's guides write one for every strategy:
    --strategy none           one replica, no strategy
    --strategy mirrored       MirroredStrategy over --world-size logical CPU devices, one process
    --strategy multi_worker   MultiWorkerMirroredStrategy, --world-size processes on 127.0.0.1,
                              each told its place by TF_CONFIG (this script starts them)
One intra-op thread per replica: a process of R replicas gets R intra-op and R inter-op threads.
Prints one line (from the chief):
    tensorflow VERSION strategy=S world_size=N examples_per_second=X parameters=HEX
HEX is a SHA-256 prefix of the final weights' bytes. The first --warmup steps are not timed.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import time


def make_task(features, classes, examples, seed=1, blobs=8, spread=0.4):
    import numpy as np
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes * blobs, features)).astype(np.float32)
    blob = rng.integers(0, classes * blobs, examples)
    x = centres[blob] + spread * rng.standard_normal((examples, features)).astype(np.float32)
    return x, (blob // blobs).astype(np.int64)


def train(args, replicas_here):
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(replicas_here)
    tf.config.threading.set_inter_op_parallelism_threads(replicas_here)
    if args.strategy == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.world_size)
        strategy = tf.distribute.MirroredStrategy(
            [f"/cpu:{index}" for index in range(args.world_size)])
    elif args.strategy == "multi_worker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = tf.distribute.get_strategy()

    layers = [int(size) for size in args.layers.split(",")]
    global_batch = args.per_replica_batch * args.world_size
    steps = args.warmup + args.steps
    x, y = make_task(layers[0], layers[-1], global_batch * steps)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = data.with_options(options)
    tf.keras.utils.set_random_seed(1)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((layers[0],))] + [
            tf.keras.layers.Dense(size, activation="relu" if index + 2 < len(layers) else None)
            for index, size in enumerate(layers[1:])
        ])
        optimizer = tf.keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE)

    def replica_step(inputs, labels):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(labels, model(inputs, training=True)),
                                              global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def step(inputs, labels):
        return strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(replica_step, args=(inputs, labels)), axis=None)

    start = None
    for index, (inputs, labels) in enumerate(strategy.experimental_distribute_dataset(data)):
        if index == args.warmup:
            start = time.perf_counter()
        step(inputs, labels).numpy()  # waits for the step, as a training loop that logs does
    seconds = time.perf_counter() - start
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return args.steps * global_batch / seconds, digest.hexdigest()[:16]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=["none", "mirrored", "multi_worker"], default="none")
    parser.add_argument("--layers", default="784,1024,1024,10")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--per-replica-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--port", type=int, default=29710)
    parser.add_argument("--task-index", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    if args.strategy == "multi_worker" and args.task_index < 0:
        workers = [f"127.0.0.1:{args.port + index}" for index in range(args.world_size)]
        processes = []
        for index in range(args.world_size):
            environment = dict(os.environ, TF_CONFIG=json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}))
            processes.append(subprocess.Popen(
                [sys.executable, __file__, *sys.argv[1:], "--task-index", str(index)],
                env=environment, stdout=subprocess.PIPE if index else None))
        codes = [process.wait(timeout=900) for process in processes]
        sys.exit(max(codes))

    import tensorflow as tf
    rate, parameters = train(args, args.world_size if args.strategy == "mirrored" else 1)
    if args.task_index <= 0:
        print(f"tensorflow {tf.__version__} strategy={args.strategy} world_size={args.world_size} "
              f"examples_per_second={rate:.0f} parameters={parameters}", flush=True)


if __name__ == "__main__":
    main()
