"""A custom op written twice: GELU (tanh approximation) (a) as an autograd.Function in array code and (b) as CUDA C
forward and backward kernels compiled at run time; both checked with gradcheck and against torch, then used to
train LeNet-5 on MNIST. Run: python examples/custom_gelu.py [--steps 300] [--check-only] (CPU without a GPU).
"""
import argparse
import math

import numpy as np

import smalltrain
from smalltrain.autograd import Function
from smalltrain.backend import get_array_module

K_BETA = math.sqrt(2.0 / math.pi)
K_KAPPA = 0.044715


# (a) array code: the same lines run on NumPy (CPU) and CuPy (CUDA) arrays, since `xp` is whichever module holds x
class GELUTanh(Function):
    """gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), its derivative written by hand."""

    @staticmethod
    def forward(ctx, x):
        a = x.array
        xp = get_array_module(a)
        t = xp.tanh(K_BETA * (a + K_KAPPA * a * a * a))
        ctx.a, ctx.t = a, t          # backward reuses tanh(inner) instead of recomputing it
        return 0.5 * a * (1 + t)

    @staticmethod
    def backward(ctx, dout):
        a, t = ctx.a, ctx.t
        # d/dx: 0.5 (1 + t) + 0.5 x (1 - t^2) * sqrt(2/pi) (1 + 3 * 0.044715 x^2)
        return dout.array * (0.5 * (1 + t) + 0.5 * a * (1 - t * t) * K_BETA * (1 + 3 * K_KAPPA * a * a))


# (b) CUDA C: a RawModule kernel for the forward, an ElementwiseKernel for the backward (both compiled once per GPU)
CUDA_FORWARD = r"""
template <typename T> __device__ void gelu_tanh(const T* x, T* y, long long n) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const T v = x[i];
        y[i] = T(0.5) * v * (T(1) + tanh(T(0.7978845608028654) * (v + T(0.044715) * v * v * v)));
    }
}
extern "C" __global__ void gelu_tanh_f32(const float* x, float* y, long long n) { gelu_tanh<float>(x, y, n); }
extern "C" __global__ void gelu_tanh_f64(const double* x, double* y, long long n) { gelu_tanh<double>(x, y, n); }
"""
CUDA_BACKWARD = """
T t = tanh(T(0.7978845608028654) * (x + T(0.044715) * x * x * x));
T inner_grad = T(0.7978845608028654) * (T(1) + T(3) * T(0.044715) * x * x);
dx = dout * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * inner_grad);
"""
_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


class GELUTanhCUDA(Function):
    """The same op on CUDA tensors through our own kernels (float32 and float64, contiguous or not)."""

    @staticmethod
    def forward(ctx, x):
        cp = get_array_module(x.array)
        a = cp.ascontiguousarray(x.array)
        if a.dtype not in _SUFFIX:
            raise TypeError(f"GELUTanhCUDA: expected float32 or float64, got {a.dtype}")
        out = cp.empty_like(a)
        kern = smalltrain.cuda.compile_module(CUDA_FORWARD).get_function("gelu_tanh_" + _SUFFIX[a.dtype])
        blocks = min((a.size + 255) // 256, 65536)
        if a.size:
            kern((blocks,), (256,), (a, out, np.int64(a.size)))
        ctx.a = a
        return out

    @staticmethod
    def backward(ctx, dout):
        kern = smalltrain.cuda.elementwise_kernel("T x, T dout", "T dx", CUDA_BACKWARD, "custom_gelu_tanh_bwd")
        return kern(ctx.a, dout.array)


def gelu_tanh(x):
    """Our GELU: the CUDA kernels for CUDA tensors, the array code otherwise."""
    return GELUTanhCUDA.apply(x) if x.device.type == "cuda" else GELUTanh.apply(x)


def check(fn, device, seed=0):
    """gradcheck in float64 on tiny inputs, and forward + gradient against torch's F.gelu(approximate='tanh')."""
    import torch

    from smalltrain.testing import golden, gradcheck

    rng = np.random.default_rng(seed)
    x64 = smalltrain.tensor(rng.standard_normal((3, 5)) * 2, device=device, requires_grad=True)
    gradcheck(fn, (x64,))
    for dtype in (np.float32, np.float64):
        x = (rng.standard_normal((4, 7, 9)) * 3).astype(dtype)
        golden(fn, lambda t: torch.nn.functional.gelu(t, approximate="tanh"), x, device=device)


def train_lenet(steps, device, batch_size=64, seed=0):
    """LeNet-5 with our GELU after every conv and hidden linear layer; returns (last loss, test accuracy %)."""
    import smalltrain.nn as nn
    import smalltrain.nn.functional as F
    from smalltrain import datasets, optim, transforms
    from smalltrain.utils.data import DataLoader

    class LeNet5(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 6, 5), nn.Conv2d(6, 16, 5)
            self.fc1, self.fc2, self.fc3 = nn.Linear(256, 120), nn.Linear(120, 84), nn.Linear(84, 10)

        def forward(self, x):
            x = F.max_pool2d(gelu_tanh(self.conv1(x)), 2)
            x = F.max_pool2d(gelu_tanh(self.conv2(x)), 2).flatten(1)
            return self.fc3(gelu_tanh(self.fc2(gelu_tanh(self.fc1(x)))))

    smalltrain.manual_seed(seed)
    train = DataLoader(datasets.MNIST(train=True, transform=transforms.ToTensor()), batch_size=batch_size,
                       shuffle=True)
    model = LeNet5().to(device)
    opt = optim.Adam(model.parameters(), lr=1e-3)
    step, loss = 0, None
    while step < steps:
        for x, y in train:
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % 100 == 0 or step == steps:
                print(f"step {step}: loss {loss.item():.4f}")
            if step == steps:
                break
    test = DataLoader(datasets.MNIST(train=False, transform=transforms.ToTensor()), batch_size=1000)
    model.eval()
    correct = total = 0
    with smalltrain.no_grad():
        for x, y in test:
            pred = model(x.to(device)).argmax(1)
            correct += int((pred == y.to(device)).sum().item())
            total += len(y)
    return loss.item(), 100.0 * correct / total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--check-only", action="store_true", help="run the checks, skip training")
    args = parser.parse_args()
    device = "cuda" if smalltrain.cuda.is_available() else "cpu"
    check(GELUTanh.apply, device)
    print(f"array-code GELU: gradcheck and torch comparison passed on {device}")
    if device == "cuda":
        check(GELUTanhCUDA.apply, device)
        print("CUDA-kernel GELU: gradcheck and torch comparison passed")
    if not args.check_only:
        loss, acc = train_lenet(args.steps, device)
        print(f"LeNet-5 with the custom GELU on {device}: {args.steps} steps, final loss {loss:.4f}, "
              f"test accuracy {acc:.2f}%")


if __name__ == "__main__":
    main()
