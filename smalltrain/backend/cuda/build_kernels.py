"""Build the prebuilt kernel binaries (kernels/prebuilt/: each kernel family's float32 module as a fatbin for sm_80
.. sm_120, and their manifest) from the current .cu sources; needs CUDA's nvcc. Run after changing a kernel file:

    python -m smalltrain.backend.cuda.build_kernels [--nvcc PATH] [--jobs N] [--force]
"""
import argparse

from . import loader, prebuilt


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m smalltrain.backend.cuda.build_kernels",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvcc", default="nvcc", help="the nvcc to build with (default: nvcc on the PATH)")
    parser.add_argument("--jobs", type=int, default=None, help="modules built at once (default: the cores)")
    parser.add_argument("--force", action="store_true",
                        help="rebuild every module (by default those whose source is unchanged are kept)")
    args = parser.parse_args(argv)
    prebuilt.build(loader.prebuilt_modules(), nvcc=args.nvcc, jobs=args.jobs, force=args.force)


if __name__ == "__main__":
    main()
