"""The bench's training step in each mode, on real MNIST batches resident on the device.

    opt.zero_grad(); loss = F.<the model's loss>(model(x), y); loss.backward(); opt.step()

smalltrain runs it eagerly or through smalltrain.compile; torch eagerly (fp32, or with its default TF32
convolutions), through torch.compile (default or reduce-overhead mode), or captured whole by hand with
torch.cuda.graph and a capturable optimizer ("torch graph", PyTorch's CUDA graphs docs, whole network capture):
on the GPU the strongest torch mode for a launch-bound step, and so the bar.
"""
import numpy as np

from ..train import MNIST_MEAN, MNIST_STD
from .zoo import build, make_optimizer, zoo_model

TRAIN_SIZE = 60000
SMALLTRAIN_MODES = ("eager", "compiled")
TORCH_MODES = ("eager", "eager-tf32", "compile", "reduce-overhead", "graph")
GRAPH_WARMUP = 3   # eager steps on a side stream before torch's capture (the docs' recipe: optimizer state exists)


def normalize(images):
    """uint8 images (N, 28, 28), NumPy or CuPy, to float32 (N, 1, 28, 28) normalized as the trainer does it
    (ToTensor's /255, then Normalize's (x - mean) / std), computed where the array lives."""
    x = images.astype(np.float32)
    x /= 255
    x -= MNIST_MEAN
    x /= MNIST_STD
    return x.reshape(-1, 1, 28, 28)


def mnist_batches(batch, count=8, data_dir=None):
    """`count` consecutive batches of the MNIST training set as NumPy arrays: float32 (count, batch, 1, 28, 28)
    normalized images and int64 (count, batch) labels (fewer batches when they would not fit in 60k)."""
    from ..datasets import MNIST
    if not 1 <= batch <= TRAIN_SIZE:
        raise ValueError(f"batch size must be between 1 and {TRAIN_SIZE}, got {batch}")
    count = max(1, min(count, TRAIN_SIZE // batch))
    ds = MNIST(root=data_dir, train=True)
    n = batch * count
    x = normalize(ds.data.numpy()[:n])
    y = ds.targets.numpy()[:n]
    return x.reshape(count, batch, 1, 28, 28), y.reshape(count, batch)


def make_step(lib, model, device, xs, ys, mode="eager"):
    """A no-argument callable running one training step of the zoo's `model` on the next of the batches xs/ys
    (NumPy, uploaded here to `device`), returning the loss.

    mode: with smalltrain "eager" or "compiled" (smalltrain.compile); with torch "eager", "eager-tf32" (torch's
    default TF32 convolutions), "compile" / "reduce-overhead" (torch.compile) or "graph" (the whole step captured
    by hand, CUDA only).
    """
    is_torch = lib.__name__ == "torch"
    modes = TORCH_MODES if is_torch else SMALLTRAIN_MODES
    if mode not in modes:
        raise ValueError(f"unknown mode {mode!r} for {lib.__name__}; expected one of {', '.join(modes)}")
    on_cuda = str(device).startswith("cuda")
    if mode in ("graph", "eager-tf32") and not on_cuda:
        raise ValueError(f"mode {mode!r} is for CUDA devices, got {device}")
    lib.manual_seed(0)
    net = build(lib, model).to(device)
    capturable = is_torch and on_cuda and mode in ("reduce-overhead", "graph")
    opt = make_optimizer(lib, model, net.parameters(), capturable)
    loss_fn = getattr(lib.nn.functional, zoo_model(model).loss)
    bx = [lib.tensor(x).to(device) for x in xs]
    by = [lib.tensor(y).to(device) for y in ys]

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss
    if mode == "compiled":
        step = lib.compile(step)
    elif mode in ("compile", "reduce-overhead"):
        lib._dynamo.reset()   # a fresh cache per model: the step's code object is shared by every config
        step = lib.compile(step, mode=None if mode == "compile" else mode)
    elif mode == "graph":
        step = _torch_graph(lib, net, opt, loss_fn, bx[0], by[0])
    elif mode == "eager-tf32":
        step = _with_tf32_convolutions(lib, step)
    position = [0]

    def run():
        i = position[0] = (position[0] + 1) % len(bx)
        return step(bx[i], by[i])
    run.step = step   # the (compiled) step itself, for a script that times its parts
    return run


def _torch_graph(torch, net, opt, loss_fn, x0, y0):
    """torch's whole step captured once by hand (warm-up on a side stream, grads set to None before the capture so
    that backward allocates them from the graph's pool), replayed on static inputs that each call copies into."""
    static_x, static_y = x0.clone(), y0.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP):
            opt.zero_grad(set_to_none=True)
            loss_fn(net(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(net(static_x), static_y)
        static_loss.backward()
        opt.step()

    def step(x, y):
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        return static_loss
    return step


def _with_tf32_convolutions(torch, step):
    """`step` with torch's default convolution precision (cuDNN TF32 allowed), the bench's fp32 setting restored
    after each call."""
    def run(x, y):
        before = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = True
        try:
            return step(x, y)
        finally:
            torch.backends.cudnn.allow_tf32 = before
    return run
