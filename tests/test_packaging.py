"""What a wheel carries: pyproject's package-data must cover every file of the package that is not Python (the
bundled MNIST, the CUDA sources and the header read_source inlines into each of them). A missing one works in a
checkout or an editable install and breaks only a real install. The CUDA emulator is test tooling (tests/tooling):
the package neither holds nor names it."""
import fnmatch
import os

import pytest

import smalltrain

tomllib = pytest.importorskip("tomllib")   # Python 3.11+


def test_every_data_file_of_the_package_is_package_data():
    package_dir = os.path.dirname(smalltrain.__file__)
    with open(os.path.join(os.path.dirname(package_dir), "pyproject.toml"), "rb") as f:
        package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    data, missing = [], []
    for folder, dirs, files in os.walk(package_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith((".py", ".pyc")):
                continue
            rel = os.path.relpath(os.path.join(folder, name), os.path.dirname(package_dir)).replace(os.sep, "/")
            data.append(rel)
            # the globs of the package that holds the file (its nearest enclosing package named in package-data)
            parts = rel.split("/")
            for cut in range(len(parts) - 1, 0, -1):
                package = ".".join(parts[:cut])
                if package in package_data:
                    inside = "/".join(parts[cut:])
                    if not any(fnmatch.fnmatch(inside, g) for g in package_data[package]):
                        missing.append(rel)
                    break
            else:
                missing.append(rel)
    assert "smalltrain/backend/cuda/kernels/common.cuh" in data
    assert not missing, f"files of the package not in pyproject's package-data: {missing}"


def test_the_package_does_not_ship_or_import_the_emulator():
    """The emulator runs g++ and loads what it builds: test tooling, kept out of what pip installs."""
    package_dir = os.path.dirname(smalltrain.__file__)
    with open(os.path.join(os.path.dirname(package_dir), "pyproject.toml"), "rb") as f:
        package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    assert not any("emulator" in g for globs in package_data.values() for g in globs)
    shipped = [os.path.join(folder, name) for folder, _, files in os.walk(package_dir) for name in files]
    assert not [p for p in shipped if "emulator" in os.path.basename(p)]
    importers = []
    for path in shipped:
        if path.endswith(".py"):
            with open(path, encoding="utf-8") as f:
                if "import cuda_emulator" in f.read():
                    importers.append(path)
    assert not importers
