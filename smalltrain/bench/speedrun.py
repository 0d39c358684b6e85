"""The speedrun: train to the target MNIST test accuracy (99.0%) as fast as possible, everything on the device.

The train and test sets are uploaded once (uint8, normalized there; inside the clock), each epoch draws a
permutation on the device, the compiled step gathers its batch from the resident set by a slice of that permutation
(the last partial batch is dropped: one shape, one graph), the scheduler steps once per step outside the compiled
step, and each evaluation runs the full 10k test set in large chunks under no_grad with one host read. Process
start, data loading from disk and a warm-up on a throwaway model (kernel compilation, caches) are reported
separately; the clock runs from the data upload before the first training step to the end of the evaluation that
first reaches the target.
"""
import time

import numpy as np

from ..utils.data.device import take_rows
from .report import environment
from .steps import TRAIN_SIZE, normalize
from .timing import seconds_since_process_start


def load_mnist_arrays(data_dir=None):
    """((train images, labels), (test images, labels)) as host NumPy arrays, images uint8 (N, 28, 28)."""
    from ..datasets import MNIST
    out = []
    for train in (True, False):
        ds = MNIST(root=data_dir, train=train)
        out.append((ds.data.numpy(), ds.targets.numpy()))
    return tuple(out)


def upload(host, device):
    """The (images, labels) pairs of `host` on `device` as Tensors: uint8 uploaded, normalized to float32 there."""
    import smalltrain

    from ..tensor import Tensor
    out = []
    for images, labels in host:
        x = smalltrain.from_numpy(np.ascontiguousarray(images)).to(device)
        out.append((Tensor._wrap(normalize(x.array)), smalltrain.from_numpy(labels).to(device)))
    return out


def device_randperm(n, device):
    """A random permutation of range(n) drawn on `device` (CuPy's generator on CUDA, seeded by manual_seed)."""
    import smalltrain

    from ..backend import as_device
    dev = as_device(device)
    if dev.type != "cuda":
        return smalltrain.randperm(n)
    from ..backend.cuda import cupy
    from ..tensor import Tensor
    cp = cupy()
    with cp.cuda.Device(dev.index):
        return Tensor._wrap(cp.random.permutation(n).astype(np.int64, copy=False))


def count_correct(model, images, labels, chunk):
    """The number of correct predictions over the whole set, summed on the device (a 0-d tensor: no host read)."""
    from ..autograd import no_grad
    model.eval()
    total = None
    with no_grad():
        for i in range(0, images.shape[0], chunk):
            c = (model(images[i:i + chunk]).argmax(1) == labels[i:i + chunk]).sum()
            total = c if total is None else total + c
    model.train()
    return total


def make_recipe(args, model, steps_per_epoch):
    """The optimizer and the scheduler (None for a constant lr) of the speedrun recipe in `args`."""
    from .. import optim
    if args.optimizer == "sgd":
        opt = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, nesterov=args.nesterov,
                        weight_decay=args.weight_decay)
    else:
        opt = optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    if args.schedule == "constant":
        return opt, None
    sched = optim.lr_scheduler.OneCycleLR(opt, max_lr=args.max_lr, total_steps=args.epochs * steps_per_epoch,
                                          pct_start=args.pct_start, div_factor=args.div_factor,
                                          final_div_factor=args.final_div_factor,
                                          cycle_momentum=args.cycle_momentum)
    return opt, sched


def evaluation_steps(epochs, steps_per_epoch, per_epoch, start):
    """The global step counts after which to evaluate: `per_epoch` evenly spaced points in each epoch from epoch
    `start` on (a float: 1.5 is the middle of the second epoch), and always the end of the last epoch."""
    points = {epochs * steps_per_epoch}
    for e in range(epochs):
        for j in range(1, per_epoch + 1):
            s = e * steps_per_epoch + round(j * steps_per_epoch / per_epoch)
            if s >= round(start * steps_per_epoch) and s > 0:   # 3.25 x 117 = 380.25 means step 380
                points.add(s)
    return sorted(points)


def _sync(device):
    if str(device).startswith("cuda"):
        import smalltrain
        smalltrain.cuda.synchronize(device)


def run_speedrun(args, host, max_steps=None, report=None):
    """One attempt of the recipe in `args` on the host arrays `host`: upload, train, evaluate until the target.

    max_steps (the warm-up) stops after that many steps and one evaluation. Returns a dict: reached, time_s (the
    clock at the end of the evaluation that reached the target, else at the end), upload_s, evaluations (dicts:
    epoch, step, time_s, accuracy, eval_s), best accuracy and the compiled step's stats. `report(evaluation)` is
    called after each evaluation.
    """
    import smalltrain

    from .. import models
    from ..tensor import Tensor
    device, batch = args.device, args.batch_size
    smalltrain.manual_seed(args.seed)
    model = models.build(args.model).to(device)
    n_train = len(host[0][1])
    steps_per_epoch = n_train // batch
    opt, sched = make_recipe(args, model, steps_per_epoch)
    eval_chunk = args.eval_batch_size or (10000 if device.startswith("cuda") else 1000)
    plan = [max_steps] if max_steps else evaluation_steps(args.epochs, steps_per_epoch, args.evals_per_epoch,
                                                          args.eval_start)
    t0 = time.perf_counter()   # the clock: data upload included
    (images, labels), (test_images, test_labels) = upload(host, device)
    _sync(device)
    upload_s = time.perf_counter() - t0

    def train_step(index):
        opt.zero_grad()
        # the targets first: an op between the model and its loss would run the chain's held launch on its own
        # (autograd/held.py), where the loss can take it into the same kernel
        y = take_rows(labels, index)
        loss = smalltrain.nn.functional.cross_entropy(model(take_rows(images, index)), y)
        loss.backward()
        opt.step()
        return loss
    step = smalltrain.compile(train_step, warmup=args.compile_warmup)
    evaluations, done, reached, next_eval = [], 0, False, 0
    n_test = test_labels.shape[0]
    while done < plan[-1] and not (reached and not args.no_stop):
        # this epoch's batches: rows of the permutation, views on the device (copied into the graph's input)
        batches = device_randperm(n_train, device).array[:steps_per_epoch * batch].reshape(steps_per_epoch, batch)
        for k in range(steps_per_epoch):
            step(Tensor._wrap(batches[k]))
            if sched is not None:
                sched.step()
            done += 1
            if done != plan[next_eval]:
                continue
            next_eval += 1
            _sync(device)   # so that the evaluation's own time can be told apart from queued training steps
            te = time.perf_counter()
            correct = count_correct(model, test_images, test_labels, eval_chunk).item()   # the one host read
            now = time.perf_counter()
            record = {"epoch": done / steps_per_epoch, "step": done, "time_s": now - t0,
                      "accuracy": correct / n_test, "eval_s": now - te}
            evaluations.append(record)
            if report:
                report(record)
            if record["accuracy"] >= args.target and not reached:
                reached, reached_at = True, record
                if not args.no_stop:
                    break
            if done >= plan[-1]:
                break
    end_s = time.perf_counter() - t0
    best = max((e["accuracy"] for e in evaluations), default=0.0)
    return {"reached": reached, "time_s": reached_at["time_s"] if reached else end_s,
            "reached_at": reached_at if reached else None, "upload_s": upload_s, "evaluations": evaluations,
            "best_accuracy": best, "steps": done, "steps_per_epoch": steps_per_epoch, "stats": dict(step.stats)}


def _recipe_line(args):
    lr = f"OneCycleLR(max_lr={args.max_lr:g}, pct_start={args.pct_start:g}, div_factor={args.div_factor:g}, " \
         f"final_div_factor={args.final_div_factor:g}, cycle_momentum={args.cycle_momentum})" \
        if args.schedule == "onecycle" else f"constant lr {args.lr:g}"
    opt = "Adam" if args.optimizer == "adam" else \
        f"SGD momentum {args.momentum:g}" + (" nesterov" if args.nesterov else "")
    if args.weight_decay:
        opt += f" weight decay {args.weight_decay:g}"
    return (f"speedrun: {args.model} on {args.device}, batch {args.batch_size} ({TRAIN_SIZE // args.batch_size} "
            f"steps per epoch, last partial batch dropped), {opt}, {lr}, at most {args.epochs} epoch(s), "
            f"{args.evals_per_epoch} evaluation(s) per epoch from epoch {args.eval_start:g} on (and at the end) over "
            f"the 10,000 test images, target {100 * args.target:.2f}%, seed {args.seed}")


def speedrun(args):
    """Print the speedrun's report; returns the result dict of run_speedrun (plus the excluded phases' times)."""
    startup = seconds_since_process_start()
    print(environment(None, args.device), flush=True)
    print(_recipe_line(args), flush=True)
    if startup is not None:
        print(f"startup    {startup:8.3f} s  process start to the benchmark: interpreter and imports (excluded)")
    t = time.perf_counter()
    host = load_mnist_arrays(args.data_dir)
    if args.device.startswith("cuda"):   # page-locked host copies: the timed upload is then one direct copy each
        from ..backend import pin
        host = tuple(tuple(pin(a) for a in pair) for pair in host)
    load_s = time.perf_counter() - t
    print(f"data load  {load_s:8.3f} s  MNIST files read and decoded into host memory"
          f"{' (pinned)' if args.device.startswith('cuda') else ''} (excluded)", flush=True)
    t = time.perf_counter()
    warm = run_speedrun(args, host, max_steps=args.warmup)
    warmup_s = time.perf_counter() - t
    print(f"warm-up    {warmup_s:8.3f} s  a throwaway model: data upload, {args.warmup} steps "
          f"({warm['stats'].get('captures', 0)} graph capture(s)), 1 evaluation; kernels compiled, caches filled "
          f"(excluded)",
          flush=True)

    def report(e):
        print(f"eval  epoch {e['epoch']:5.2f}  step {e['step']:6d}  time {e['time_s']:9.4f} s  test accuracy "
              f"{100 * e['accuracy']:6.2f}%  (this evaluation {1e3 * e['eval_s']:.1f} ms)", flush=True)
    result = run_speedrun(args, host, report=report)
    result.update(startup_s=startup, load_s=load_s, warmup_s=warmup_s)
    evals = result["evaluations"]
    if result["reached"]:
        at = result["reached_at"]
        counted = [e for e in evals if e["step"] <= at["step"]]
        print(f"reached {100 * at['accuracy']:.2f}% (target {100 * args.target:.2f}%) in {at['time_s']:.4f} s at "
              f"epoch {at['epoch']:.2f}, step {at['step']}: the clock from the data upload before the first training "
              f"step to the end of that evaluation; data upload {1e3 * result['upload_s']:.1f} ms and "
              f"{len(counted)} evaluation(s) {1e3 * sum(e['eval_s'] for e in counted):.1f} ms included")
    else:
        print(f"did not reach {100 * args.target:.2f}% in {args.epochs} epoch(s): "
              f"best {100 * result['best_accuracy']:.2f}%"
              f" after {result['time_s']:.4f} s")
    s = result["stats"]
    print(f"compiled step: {s.get('captures', 0)} capture(s), {s.get('replays', 0)} replays, {s.get('eager', 0)} "
          f"eager calls")
    return result
