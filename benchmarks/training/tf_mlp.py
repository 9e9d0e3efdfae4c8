"""TensorFlow's tf.distribute on the benchmark's MLP.

The model of benchmarks/training/run (ReLU MLP, softmax cross-entropy, Adam, Gaussian blobs),
written as a Keras model, under one of
    --strategy none           one replica, no strategy
    --strategy mirrored       MirroredStrategy over --world-size logical CPU devices, one process
    --strategy multi_worker   MultiWorkerMirroredStrategy, --world-size processes on 127.0.0.1,
                              each told its place by TF_CONFIG (this script starts them)
and trained by one of the two loops tf.distribute's guides write for every strategy:
    --loop custom   the custom training loop: a global-batch tf.data pipeline ending in
                    .prefetch(tf.data.AUTOTUNE), strategy.experimental_distribute_dataset, and a
                    tf.function that calls strategy.run; the loss is summed over the steps and
                    read at the end, as the guide's loop does
    --loop fit      Keras model.compile and model.fit over the same data set, Keras's defaults
One intra-op thread per replica: a process of R replicas gets R intra-op and R inter-op threads.
Adam's epsilon is 1e-8, as torch's and cohort's (Keras's default is 1e-7).
Prints one line (from the chief):
    tensorflow VERSION strategy=S loop=L world_size=N examples_per_second=X parameters=HEX
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
    # Each worker keeps its part of every global batch, in rank order, as cohort and DDP split it.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = data.with_options(options).prefetch(tf.data.AUTOTUNE)
    tf.keras.utils.set_random_seed(1)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((layers[0],))] + [
            tf.keras.layers.Dense(size, activation="relu" if index + 2 < len(layers) else None)
            for index, size in enumerate(layers[1:])
        ])
        optimizer = tf.keras.optimizers.Adam(args.learning_rate, epsilon=1e-8)
    if args.loop == "fit":
        seconds = fit(tf, strategy, model, optimizer, data, args.warmup)
    else:
        seconds = custom_loop(tf, strategy, model, optimizer, data, args.warmup, global_batch)
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return args.steps * global_batch / seconds, digest.hexdigest()[:16]


def custom_loop(tf, strategy, model, optimizer, data, warmup, global_batch):
    """The guides' custom training loop; returns the seconds of the steps after `warmup`."""
    with strategy.scope():
        optimizer.build(model.trainable_variables)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

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

    start, total = None, 0.0
    for index, (inputs, labels) in enumerate(strategy.experimental_distribute_dataset(data)):
        if index == warmup:
            float(total)  # the warm-up steps are done before the clock starts
            start = time.perf_counter()
        total += step(inputs, labels)
    float(total)
    return time.perf_counter() - start


def fit(tf, strategy, model, optimizer, data, warmup):
    """Keras's model.fit, one epoch over the data set; returns the seconds of the steps after
    `warmup` (from the start of batch `warmup` to the end of training)."""
    with strategy.scope():
        model.compile(optimizer=optimizer,
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class Clock(tf.keras.callbacks.Callback):
        start = None

        def on_train_batch_begin(self, batch, logs=None):
            if batch == warmup:
                self.start = time.perf_counter()

    clock = Clock()
    model.fit(data, epochs=1, verbose=0, callbacks=[clock])
    return time.perf_counter() - clock.start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=["none", "mirrored", "multi_worker"], default="none")
    parser.add_argument("--loop", choices=["custom", "fit"], default="custom")
    parser.add_argument("--layers", default="784,1024,1024,10")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--per-replica-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
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
        print(f"tensorflow {tf.__version__} strategy={args.strategy} loop={args.loop} "
              f"world_size={args.world_size} "
              f"examples_per_second={rate:.0f} parameters={parameters}", flush=True)


if __name__ == "__main__":
    main()
