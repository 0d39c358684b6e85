"""`smalltrain.backends`, torch.backends' switches as far as smalltrain has them.

cudnn: smalltrain does not use cuDNN (convolutions are our own kernels and cuBLAS GEMMs), so `benchmark`,
`deterministic`, `enabled` and `allow_tf32` are accepted and kept, and change nothing. Our kernels are
deterministic run to run except where a backward sums with atomics (noted in their files).
mps: not supported (is_available() is False).
cuda.matmul.allow_tf32: real. cuBLAS float32 GEMMs (Linear, matmul, the GEMMs of Conv2d) use TF32 tensor cores
when it is True; False by default (as torch), or True where CUPY_TF32=1 was set before the first GEMM.
"""
import os


class _Cudnn:
    """torch.backends.cudnn: accepted no-ops (smalltrain uses no cuDNN)."""

    def __init__(self):
        self.benchmark = False
        self.deterministic = False
        self.enabled = True
        self.allow_tf32 = True

    @staticmethod
    def is_available():
        return False

    @staticmethod
    def version():
        return None

    def __repr__(self):
        return (f"<smalltrain.backends.cudnn (no-op): benchmark={self.benchmark}, deterministic={self.deterministic}, "
                f"enabled={self.enabled}>")


class _Mps:
    @staticmethod
    def is_available():
        return False

    @staticmethod
    def is_built():
        return False


_TF32_MATH, _DEFAULT_MATH = 3, 0   # cublasMath_t: CUBLAS_TF32_TENSOR_OP_MATH, CUBLAS_DEFAULT_MATH


class _Matmul:
    """torch.backends.cuda.matmul: allow_tf32 reads and sets the math mode of smalltrain's cuBLAS handles."""

    @property
    def allow_tf32(self):
        lib = _blas_lib()
        return bool(lib.tf32) if lib is not None else os.getenv("CUPY_TF32") == "1"

    @allow_tf32.setter
    def allow_tf32(self, value):
        value = bool(value)
        os.environ["CUPY_TF32"] = "1" if value else "0"   # read when the cuBLAS handles are made (backend/cuda/blas)
        lib = _blas_lib()
        if lib is None:
            return
        lib.tf32 = value
        for handle, _ in lib.handles.values():   # handles already made switch now
            err = lib.cublasSetMathMode(handle, _TF32_MATH if value else _DEFAULT_MATH)
            if err:
                raise RuntimeError(f"backends.cuda.matmul.allow_tf32: cublasSetMathMode failed with status {err}")


def _blas_lib():
    """The cuBLAS wrapper's state where it was made (a GEMM ran on CUDA), else None; never imports CuPy."""
    import sys
    blas = sys.modules.get("smalltrain.backend.cuda.blas")
    return getattr(blas, "_lib", None) if blas is not None else None


class _Cuda:
    def __init__(self):
        self.matmul = _Matmul()

    @staticmethod
    def is_built():
        from .backend import cuda
        return cuda.is_available()


cudnn = _Cudnn()
mps = _Mps()
cuda = _Cuda()


def set_float32_matmul_precision(precision):
    """'highest' -> full float32 GEMMs; 'high' or 'medium' -> TF32 (torch.set_float32_matmul_precision)."""
    if precision not in ("highest", "high", "medium"):
        raise RuntimeError(f"set_float32_matmul_precision: expected 'highest', 'high' or 'medium', got {precision!r}")
    cuda.matmul.allow_tf32 = precision != "highest"


def get_float32_matmul_precision():
    return "high" if cuda.matmul.allow_tf32 else "highest"
