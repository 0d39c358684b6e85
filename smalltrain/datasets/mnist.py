"""MNIST (bundled with the package) and FashionMNIST (downloaded), torchvision's interface on NumPy arrays.

The images stay uint8 in memory; a sample or a whole batch (`__getitems__`, one gather) is converted on access.
Downloads are MD5-verified and written atomically, so a failed or corrupt download never leaves a file behind.
"""
import collections
import gzip
import hashlib
import http.client
import operator
import os
import urllib.error
import urllib.request

import numpy as np

from .. import transforms as _transforms
from ..tensor import Tensor
from ..utils.data.dataset import BatchedSamples, Dataset, _index_array
from ..utils.io import atomic_write
from . import idx

__all__ = ["DEFAULT_ROOT", "MIRRORS", "MNIST", "DatasetNotFoundError", "FashionMNIST"]

BUNDLED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "mnist")
DEFAULT_ROOT = os.path.join(os.path.expanduser("~"), ".cache", "smalltrain", "datasets")
# base URLs tried in order by download(), looked up at call time so tests can point them at a local server
MIRRORS = {
    "MNIST": ["https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"],
    "FashionMNIST": ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"],
}
DOWNLOAD_TIMEOUT = 30.0
# download() first copies the files shipped with smalltrain (so it works offline); tests of the HTTP path turn it off
DOWNLOAD_FROM_BUNDLED = True


class DatasetNotFoundError(FileNotFoundError, RuntimeError):
    """The data files are not where we looked (also a RuntimeError, which is what torchvision raises)."""


Resource = collections.namedtuple("Resource", "name gz_md5s raw_md5")
Resource.__doc__ = "One IDX file: name without '.gz', accepted MD5s of the .gz, MD5 of the decompressed bytes."


def _md5(data=b""):
    return hashlib.md5(data, usedforsecurity=False)


def _file_key(path):
    st = os.stat(path)
    return os.path.realpath(path), st.st_size, st.st_mtime_ns


_VERIFIED = set()                       # file keys whose MD5 matched: each file is hashed once per process
_ARRAYS = collections.OrderedDict()     # file key -> decoded array (decompressing MNIST's images takes ~0.5 s)
_ARRAY_CACHE_SIZE = 8


def _content_ok(data, res):
    """Whether `data` (a whole file) is `res`: a known .gz MD5, or the known MD5 of its decompressed bytes."""
    if _md5(data).hexdigest() in res.gz_md5s:
        return True
    if res.raw_md5 is None:
        return False
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError):
            return False
    return _md5(data).hexdigest() == res.raw_md5


def _file_ok(path, res):
    key = _file_key(path)
    if key not in _VERIFIED:
        with open(path, "rb") as f:
            if not _content_ok(f.read(), res):
                return False
        _VERIFIED.add(key)
    return True


def _read_checked(path, raw_md5=None):
    """A private copy of the IDX array in `path`; with raw_md5, the decompressed bytes must match it (checked
    once per process, in the same pass that decodes the file)."""
    key = _file_key(path)
    check = raw_md5 is not None and key not in _VERIFIED
    array = _ARRAYS.get(key)
    if array is None or check:
        digest = _md5() if check else None
        array = idx._read(path, digest)
        if check:
            if digest.hexdigest() != raw_md5:
                raise RuntimeError(f"{path}: MD5 of the decompressed data is {digest.hexdigest()}, expected "
                                   f"{raw_md5}: the file is corrupt")
            _VERIFIED.add(key)
        _ARRAYS[key] = array
        while len(_ARRAYS) > _ARRAY_CACHE_SIZE:
            _ARRAYS.popitem(last=False)
    _ARRAYS.move_to_end(key)
    return array.copy()


def _bundled_raw_md5s():
    with open(os.path.join(BUNDLED_DIR, "MD5SUMS.raw")) as f:
        return {name: digest for digest, name in (line.split() for line in f if line.strip())}


def _why(err):
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {err.reason}"
    if isinstance(err, urllib.error.URLError):
        return f"{type(err.reason).__name__}: {err.reason}" if isinstance(err.reason, Exception) else str(err.reason)
    return f"{type(err).__name__}: {err}"


def _http_get(url):
    request = urllib.request.Request(url, headers={"User-Agent": "smalltrain"})
    with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT) as response:
        return response.read()


_TO_TENSOR = _transforms.ToTensor()
_RAW = _bundled_raw_md5s()


class MNIST(Dataset):
    """The MNIST digits: 60000 training / 10000 test images, uint8 28x28, labels 0-9.

    root=None reads the copy bundled with smalltrain (MD5-checked on first use). Otherwise the IDX files
    (gz or not) are looked for in `root/MNIST/raw` (torchvision's layout) and in `root`; download=True fetches
    missing ones into `root/MNIST/raw`.

    `data` (uint8 [N, 28, 28]) and `targets` (int64 [N]) are Tensors over the arrays the dataset indexes.
    `ds[i]` is (image, label): without a transform the image is what ToTensor gives (float32 [1, 28, 28] in
    [0, 1]; torchvision would give a PIL image, which we do not have); a transform receives the uint8 [28, 28]
    NumPy array (ToTensor accepts it). `__getitems__` gathers a batch in one call and, for transforms made of
    ToTensor/Normalize, converts it in one vectorized pass.
    """

    # accepted .gz MD5s: torchvision's published ones (what the mirrors serve), then the bundled copies'
    # (compressed differently; their decompressed bytes are the same, see MD5SUMS.raw)
    resources = (
        Resource("train-images-idx3-ubyte", {"f68b3c2dcbeaaa9fbdd348bbdeb94873", "c7dfcf1bfd3481a40f7b3aedbdbd083c"},
                 _RAW["train-images-idx3-ubyte"]),
        Resource("train-labels-idx1-ubyte", {"d53e105ee54ea40749a09fcbcd1e9432", "d289298a347a2cc65765a3c81043ba88"},
                 _RAW["train-labels-idx1-ubyte"]),
        Resource("t10k-images-idx3-ubyte", {"9fb629c4189551a2d022fa330f9573f3", "ecff87aa27c74fbc2c1f97e89c19221d"},
                 _RAW["t10k-images-idx3-ubyte"]),
        Resource("t10k-labels-idx1-ubyte", {"ec29112dd5afa0611ce80d1b7f02629c", "a38049bc042dc6e683842a84160daae1"},
                 _RAW["t10k-labels-idx1-ubyte"]),
    )
    classes = ("0 - zero", "1 - one", "2 - two", "3 - three", "4 - four", "5 - five", "6 - six", "7 - seven",
               "8 - eight", "9 - nine")
    bundled = True
    mirrors_key = "MNIST"

    def __init__(self, root=None, train=True, transform=None, target_transform=None, download=False):
        self.root = None if root is None else os.path.expanduser(os.fspath(root))
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        if download:
            self.download()
        images, labels = (self._resource(n) for n in self._split_names())
        images_path = self._locate(images, verify=download)
        labels_path = self._locate(labels, verify=download)
        self._images = self._read(images_path, images, ndim=3)
        self._labels = self._read(labels_path, labels, ndim=1).astype(np.int64)
        if len(self._images) != len(self._labels):
            raise ValueError(f"{type(self).__name__}: {images_path} holds {len(self._images)} images but "
                             f"{labels_path} holds {len(self._labels)} labels")
        self._check_content(images_path, labels_path)

    def _check_content(self, images_path, labels_path):
        """Images of 28x28 and labels that are class indices: a bad file fails here, naming it, not in the
        loss after an epoch of training."""
        if self._images.shape[1:] != (28, 28):
            raise ValueError(f"{type(self).__name__}: {images_path}: expected images of 28x28 pixels, got "
                             f"{list(self._images.shape)}")
        n = len(self.classes)
        bad = np.flatnonzero(self._labels >= n)   # uint8 on disk: never negative
        if bad.size:
            raise ValueError(f"{type(self).__name__}: {labels_path}: label {int(self._labels[bad[0]])} at index "
                             f"{int(bad[0])} is not a class index in 0..{n - 1} ({bad.size} such labels)")

    # ---- the data ----------------------------------------------------------------------------------------
    @property
    def data(self):
        return Tensor._wrap(self._images)

    @data.setter
    def data(self, value):               # torchvision users shrink datasets with `ds.data = ds.data[:n]`
        self._images = np.asarray(value.numpy() if isinstance(value, Tensor) else value)

    @property
    def targets(self):
        return Tensor._wrap(self._labels)

    @targets.setter
    def targets(self, value):
        self._labels = np.asarray(value.numpy() if isinstance(value, Tensor) else value).astype(np.int64)

    def __len__(self):
        return len(self._labels)

    def __getitem__(self, index):
        i = operator.index(index)
        img, target = self._images[i].copy(), int(self._labels[i])
        img = _TO_TENSOR(img) if self.transform is None else self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __getitems__(self, indices):
        """The samples at `indices`, gathered with one fancy index; BatchedSamples when vectorizable."""
        index = _index_array(indices, len(self), type(self).__name__)
        if self.target_transform is None:
            batch = _transforms.apply_batch(self.transform or _TO_TENSOR, self._images[index])
            if batch is not None:
                return BatchedSamples((batch, Tensor._wrap(self._labels[index])), scalar=(False, True))
        return [self[i] for i in index.tolist()]

    # ---- files -------------------------------------------------------------------------------------------
    @property
    def raw_folder(self):
        return os.path.join(self.root or DEFAULT_ROOT, type(self).__name__, "raw")

    @property
    def class_to_idx(self):
        return {c: i for i, c in enumerate(self.classes)}

    def _split_names(self):
        return ("train-images-idx3-ubyte", "train-labels-idx1-ubyte") if self.train else \
            ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

    def _resource(self, name):
        return next(r for r in self.resources if r.name == name)

    def _search_dirs(self):
        if self.root is None:
            return ([BUNDLED_DIR] if self.bundled else []) + [self.raw_folder]
        return [self.raw_folder, self.root]

    def _locate(self, res, verify=False):
        """The first existing `name` or `name.gz` in the search dirs (with verify, the first whose MD5 matches)."""
        for d in self._search_dirs():
            for path in (os.path.join(d, res.name), os.path.join(d, res.name + ".gz")):
                if os.path.isfile(path) and (not verify or _file_ok(path, res)):
                    return path
        if verify:
            return None
        looked = ", ".join(self._search_dirs())
        raise DatasetNotFoundError(f"{type(self).__name__}: {res.name}[.gz] not found (looked in {looked}); "
                                   f"pass download=True to download it")

    def _read(self, path, res, ndim):
        bundled = os.path.dirname(os.path.realpath(path)) == os.path.realpath(BUNDLED_DIR)
        array = _read_checked(path, res.raw_md5 if bundled else None)
        if array.dtype != np.uint8 or array.ndim != ndim:
            what = "images [N, H, W]" if ndim == 3 else "labels [N]"
            raise ValueError(f"{path}: expected uint8 {what}, got {array.dtype.name} {list(array.shape)}")
        return array

    def _check_exists(self):
        return all(self._locate(r, verify=True) is not None for r in self.resources)

    def download(self):
        """Fetch every missing or corrupt file into raw_folder, trying MIRRORS in order; a no-op when verified
        copies exist. Raises RuntimeError naming each URL tried and why it failed."""
        for res in self.resources:
            if self._locate(res, verify=True) is None:
                self._fetch(res)

    def _fetch(self, res):
        filename = res.name + ".gz"
        dest = os.path.join(self.raw_folder, filename)
        tried = []
        bundled = os.path.join(BUNDLED_DIR, filename)
        if DOWNLOAD_FROM_BUNDLED and self.bundled and os.path.exists(bundled):
            # the copy shipped with smalltrain is the first mirror: download=True works offline
            with open(bundled, "rb") as f:
                data = f.read()
            if _content_ok(data, res):
                with atomic_write(dest) as f:
                    f.write(data)
                _VERIFIED.add(_file_key(dest))
                return dest
            tried.append(f"{bundled}: checksum mismatch")
        for mirror in MIRRORS[self.mirrors_key]:
            url = mirror.rstrip("/") + "/" + filename
            try:
                data = _http_get(url)
            except (OSError, http.client.HTTPException, ValueError) as e:   # URLError, timeouts, resets, bad URL
                tried.append(f"{url}: {_why(e)}")
                continue
            if not _content_ok(data, res):
                tried.append(f"{url}: checksum mismatch (got MD5 {_md5(data).hexdigest()}, expected one of "
                             f"{sorted(res.gz_md5s)})")
                continue
            with atomic_write(dest) as f:
                f.write(data)
            _VERIFIED.add(_file_key(dest))
            return dest
        raise RuntimeError(f"{type(self).__name__}: could not download {filename}; tried:\n  " +
                           ("\n  ".join(tried) or "(no mirrors configured)"))

    def __repr__(self):
        lines = [f"Number of datapoints: {len(self)}", f"Root location: {self.root or BUNDLED_DIR}",
                 f"Split: {'Train' if self.train is True else 'Test'}"]
        if self.transform is not None:
            lines.append(f"Transform: {self.transform!r}".replace("\n", "\n    "))
        if self.target_transform is not None:
            lines.append(f"Target transform: {self.target_transform!r}".replace("\n", "\n    "))
        return f"Dataset {type(self).__name__}\n" + "\n".join("    " + line for line in lines)


class FashionMNIST(MNIST):
    """Zalando's Fashion-MNIST: MNIST's format and interface, ten kinds of clothing. Not bundled: download=True
    fetches it (into root/FashionMNIST/raw, root defaulting to DEFAULT_ROOT)."""

    resources = (
        Resource("train-images-idx3-ubyte", {"8d4fb7e6c68d591d4c3dfef9ec88bf0d"}, None),
        Resource("train-labels-idx1-ubyte", {"25c81989df183df01b3e8a0aad5dffbe"}, None),
        Resource("t10k-images-idx3-ubyte", {"bef4ecab320f06d8554ea6380940ec79"}, None),
        Resource("t10k-labels-idx1-ubyte", {"bb300cfdad3c16e7a12a480ee83cd310"}, None),
    )
    classes = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
               "Ankle boot")
    bundled = False
    mirrors_key = "FashionMNIST"
