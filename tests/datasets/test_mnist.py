"""Tests for smalltrain.datasets.mnist: the bundled files (counts, MD5, label histograms, torch's own decoding),
samples and vectorized batches, the root layouts, every missing/corrupt-file error, and downloads from a local
HTTP mirror (success, no-op, checksum mismatch, unreachable and 404 mirrors)."""
import gzip
import os
import shutil

import numpy as np
import pytest
import torch

import smalltrain
from smalltrain import transforms as T
from smalltrain.datasets import MNIST, DatasetNotFoundError, FashionMNIST, IdxFormatError, mnist, write_idx
from smalltrain.utils.data import BatchedSamples

BUNDLED = mnist.BUNDLED_DIR
# the class counts every MNIST user knows (torchvision's MNIST gives the same bincount)
TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
NAMES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
MEAN, STD = 0.1307, 0.3081


@pytest.fixture(scope="module")
def test_set():
    return MNIST(train=False)


def decompressed(path):
    with open(path, "rb") as f:
        return gzip.decompress(f.read())


def torch_decode(path):
    """The file decoded the way torchvision does it: torch.frombuffer on the decompressed bytes after the header."""
    raw = decompressed(path)
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


@pytest.mark.parametrize("train, n, counts", [(True, 60000, TRAIN_COUNTS), (False, 10000, TEST_COUNTS)])
def test_bundled_split_matches_torch_decoding_and_known_counts(train, n, counts):
    ds = MNIST(train=train)
    assert len(ds) == n
    assert isinstance(ds.data, smalltrain.Tensor) and ds.data.dtype == smalltrain.uint8
    assert tuple(ds.data.shape) == (n, 28, 28)
    assert ds.targets.dtype == smalltrain.int64 and tuple(ds.targets.shape) == (n,)
    assert np.bincount(ds.targets.numpy()).tolist() == counts
    prefix = "train" if train else "t10k"
    labels_file, images_file = f"{BUNDLED}/{prefix}-labels-idx1-ubyte.gz", f"{BUNDLED}/{prefix}-images-idx3-ubyte.gz"
    np.testing.assert_array_equal(ds.targets.numpy(), torch_decode(labels_file).numpy())
    if not train:   # the training images are covered by the MD5 of their decompressed bytes, checked on load
        np.testing.assert_array_equal(ds.data.numpy(), torch_decode(images_file).numpy())
    assert all(mnist._file_key(f"{BUNDLED}/{prefix}-{kind}.gz") in mnist._VERIFIED
               for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"))


def test_known_md5s_cover_the_bundled_files():
    import hashlib
    for res in MNIST.resources:
        with open(f"{BUNDLED}/{res.name}.gz", "rb") as f:
            packed = f.read()
        assert hashlib.md5(packed).hexdigest() in res.gz_md5s
        assert hashlib.md5(gzip.decompress(packed)).hexdigest() == res.raw_md5
    assert all(len(r.gz_md5s) == 1 and r.raw_md5 is None for r in FashionMNIST.resources)


def test_bundled_md5_is_checked_once_per_process(monkeypatch, test_set):
    keys = [mnist._file_key(f"{BUNDLED}/{n}.gz") for n in NAMES[2:]]
    assert all(k in mnist._VERIFIED for k in keys)
    hashed = []
    monkeypatch.setattr(mnist, "_md5", lambda data=b"": hashed.append(1) or __import__("hashlib").md5(data))
    MNIST(train=False)
    assert hashed == []


def test_corrupt_bundled_copy_is_detected(tmp_path, monkeypatch):
    for n in NAMES[2:]:
        shutil.copy(f"{BUNDLED}/{n}.gz", tmp_path)
    labels = mnist.idx.read_idx(tmp_path / "t10k-labels-idx1-ubyte.gz")
    labels[0] = (labels[0] + 1) % 10
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels)
    monkeypatch.setattr(mnist, "BUNDLED_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="t10k-labels-idx1-ubyte.gz: MD5 of the decompressed data is"):
        MNIST(train=False)


def test_sample_without_transform_is_totensor_output(test_set):
    x, y = test_set[7]
    assert isinstance(x, smalltrain.Tensor) and x.dtype == smalltrain.float32 and tuple(x.shape) == (1, 28, 28)
    expected = torch.from_numpy(test_set.data.numpy()[7]).float().div(255).unsqueeze(0)
    np.testing.assert_array_equal(x.numpy(), expected.numpy())
    assert type(y) is int and y == int(test_set.targets.numpy()[7])
    assert test_set[-1][1] == int(test_set.targets.numpy()[-1])
    with pytest.raises(IndexError):
        test_set[10000]


def test_transform_receives_uint8_array_and_target_transform_the_int():
    seen = []
    ds = MNIST(train=False, transform=T.Lambda(lambda a: seen.append(a) or a.sum()),
               target_transform=lambda t: t * 10)
    total, target = ds[3]
    assert seen[0].dtype == np.uint8 and seen[0].shape == (28, 28)
    assert total == int(ds.data.numpy()[3].sum()) and target == 10 * int(ds.targets.numpy()[3])
    seen[0][:] = 0                                  # the transform got a copy, not a view of the dataset
    assert ds.data.numpy()[3].sum() == total


def _stack(samples):
    return np.stack([s[0].numpy() for s in samples]), [s[1] for s in samples]


@pytest.mark.parametrize("transform", [None, T.ToTensor(), T.Compose([T.ToTensor(), T.Normalize((MEAN,), (STD,))])],
                         ids=["none", "totensor", "normalize"])
def test_getitems_is_one_vectorized_batch_equal_to_getitem(transform):
    ds = MNIST(train=False, transform=transform)
    index = [0, 9999, 5, 5, -3, 1234]
    batch = ds.__getitems__(index)
    assert isinstance(batch, BatchedSamples) and len(batch) == len(index)
    images, labels = batch.collated()
    expected_images, expected_labels = _stack([ds[i] for i in index])
    assert images.dtype == smalltrain.float32 and tuple(images.shape) == (6, 1, 28, 28)
    np.testing.assert_array_equal(images.numpy(), expected_images)
    assert labels.dtype == smalltrain.int64 and labels.numpy().tolist() == expected_labels
    assert batch[1][1] == expected_labels[1] and type(batch[1][1]) is int
    np.testing.assert_array_equal(batch[2][0].numpy(), expected_images[2])


def test_normalize_matches_torchvision_arithmetic(test_set):
    ds = MNIST(train=False, transform=T.Compose([T.ToTensor(), T.Normalize((MEAN,), (STD,))]))
    images, _ = ds.__getitems__(np.arange(64)).collated()
    x = torch.from_numpy(test_set.data.numpy()[:64]).unsqueeze(1).float().div(255)
    ref = x.sub_(torch.tensor([MEAN]).view(-1, 1, 1)).div_(torch.tensor([STD]).view(-1, 1, 1))
    np.testing.assert_array_equal(images.numpy(), ref.numpy())


@pytest.mark.parametrize("kwargs", [{"transform": T.Lambda(lambda a: a.astype(np.float32).mean())},
                                    {"transform": T.ToTensor(), "target_transform": lambda t: -t}],
                         ids=["lambda", "target-transform"])
def test_getitems_falls_back_per_sample(kwargs):
    ds = MNIST(train=False, **kwargs)
    batch = ds.__getitems__([4, 2, 4])
    assert isinstance(batch, list) and len(batch) == 3
    for got, i in zip(batch, [4, 2, 4]):
        want = ds[i]
        assert got[1] == want[1]
        np.testing.assert_array_equal(np.asarray(got[0].numpy() if hasattr(got[0], "numpy") else got[0]),
                                      np.asarray(want[0].numpy() if hasattr(want[0], "numpy") else want[0]))
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, 10000])


def test_data_and_targets_can_be_replaced_like_torchvision(test_set):
    ds = MNIST(train=False)
    ds.data, ds.targets = ds.data[:100], ds.targets[:100]
    assert len(ds) == 100
    np.testing.assert_array_equal(ds[99][0].numpy(), test_set[99][0].numpy())
    assert ds.__getitems__([99]).collated()[1].numpy().tolist() == [test_set[99][1]]


def test_repr_and_classes():
    ds = MNIST(train=False, transform=T.ToTensor())
    assert repr(ds) == (f"Dataset MNIST\n    Number of datapoints: 10000\n    Root location: {BUNDLED}\n"
                        f"    Split: Test\n    Transform: ToTensor()")
    assert ds.class_to_idx["3 - three"] == 3 and FashionMNIST.classes[9] == "Ankle boot"


def copy_test_split(dest, gz=True):
    os.makedirs(dest, exist_ok=True)
    for n in NAMES[2:]:
        if gz:
            shutil.copy(f"{BUNDLED}/{n}.gz", dest)
        else:
            with open(os.path.join(dest, n), "wb") as f:
                f.write(decompressed(f"{BUNDLED}/{n}.gz"))


@pytest.mark.parametrize("layout", ["root-plain", "root-gz", "torchvision-raw-plain", "torchvision-raw-gz"])
def test_root_layouts(tmp_path, layout, test_set):
    where = tmp_path if layout.startswith("root") else tmp_path / "MNIST" / "raw"
    copy_test_split(where, gz=layout.endswith("gz"))
    ds = MNIST(root=tmp_path, train=False)
    np.testing.assert_array_equal(ds.data.numpy(), test_set.data.numpy())
    np.testing.assert_array_equal(ds.targets.numpy(), test_set.targets.numpy())
    assert ds.raw_folder == str(tmp_path / "MNIST" / "raw")


def test_missing_data_names_the_path_and_suggests_download(tmp_path):
    with pytest.raises(DatasetNotFoundError) as info:
        MNIST(root=tmp_path / "nowhere", train=False)
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, RuntimeError)
    message = str(info.value)
    assert str(tmp_path / "nowhere") in message and "download=True" in message
    assert "t10k-images-idx3-ubyte" in message
    with pytest.raises(RuntimeError, match="download=True"):
        FashionMNIST(root=tmp_path, train=False)


def test_image_label_count_mismatch_names_both_files(tmp_path):
    copy_test_split(tmp_path)
    labels = mnist.idx.read_idx(tmp_path / "t10k-labels-idx1-ubyte.gz")
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels[:9999])
    with pytest.raises(ValueError) as info:
        MNIST(root=tmp_path, train=False)
    message = str(info.value)
    assert "t10k-images-idx3-ubyte.gz holds 10000 images" in message
    assert f"{tmp_path}/t10k-labels-idx1-ubyte.gz holds 9999 labels" in message


def test_wrong_kind_of_file_and_corrupt_file_are_named(tmp_path):
    copy_test_split(tmp_path)
    labels = mnist.idx.read_idx(tmp_path / "t10k-labels-idx1-ubyte.gz")
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels.astype(np.int32))
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.gz: expected uint8 labels"):
        MNIST(root=tmp_path, train=False)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(b"\x00\x00\x08\x01\x00\x00\x27\x10" + b"\x01" * 10)
    with pytest.raises(IdxFormatError, match="truncated payload"):
        MNIST(root=tmp_path, train=False)



def test_labels_outside_the_classes_are_refused_at_load_naming_the_file(tmp_path):
    """A label of 10 used to load fine and fail in cross_entropy after a whole epoch; now the load names it."""
    copy_test_split(tmp_path)
    labels = mnist.idx.read_idx(tmp_path / "t10k-labels-idx1-ubyte.gz")
    labels[[17, 4000]] = [10, 255]
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels)
    with pytest.raises(ValueError) as info:
        MNIST(root=tmp_path, train=False)
    assert str(info.value) == (f"MNIST: {tmp_path}/t10k-labels-idx1-ubyte.gz: label 10 at index 17 is not a class "
                               "index in 0..9 (2 such labels)")


def test_images_of_another_size_are_refused_at_load_naming_the_file(tmp_path):
    copy_test_split(tmp_path)
    images = mnist.idx.read_idx(tmp_path / "t10k-images-idx3-ubyte.gz")
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images[:, :27, :])
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte.gz: expected images of 28x28 pixels, got "
                                         r"\[10000, 27, 28\]"):
        MNIST(root=tmp_path, train=False)

# ---- downloads from a local mirror ---------------------------------------------------------------------------
@pytest.fixture
def good_mirror(tmp_path, serve):
    served = tmp_path / "served"
    os.makedirs(served)
    for n in NAMES:
        shutil.copy(f"{BUNDLED}/{n}.gz", served)
    return serve(served)


def test_download_fetches_verifies_and_is_then_a_no_op(tmp_path, monkeypatch, good_mirror, test_set):
    monkeypatch.setattr(mnist, "DOWNLOAD_FROM_BUNDLED", False)
    monkeypatch.setitem(mnist.MIRRORS, "MNIST", [good_mirror.url])
    root = tmp_path / "root"
    ds = MNIST(root=root, train=False, download=True)
    assert sorted(good_mirror.paths) == sorted(f"/{n}.gz" for n in NAMES)
    assert sorted(os.listdir(root / "MNIST" / "raw")) == sorted(f"{n}.gz" for n in NAMES)
    np.testing.assert_array_equal(ds.data.numpy(), test_set.data.numpy())
    MNIST(root=root, train=True, download=True)
    assert len(good_mirror.paths) == 4                 # verified files exist: nothing fetched again
    MNIST(download=True, train=False)                  # the bundled copy needs no download either
    assert len(good_mirror.paths) == 4


def test_download_replaces_a_corrupt_existing_file(tmp_path, monkeypatch, good_mirror):
    monkeypatch.setattr(mnist, "DOWNLOAD_FROM_BUNDLED", False)
    monkeypatch.setitem(mnist.MIRRORS, "MNIST", [good_mirror.url])
    raw = tmp_path / "root" / "MNIST" / "raw"
    os.makedirs(raw)
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(b"garbage")
    ds = MNIST(root=tmp_path / "root", train=False, download=True)
    assert len(ds) == 10000 and "/t10k-labels-idx1-ubyte.gz" in good_mirror.paths


def test_checksum_mismatch_fails_and_leaves_no_file(tmp_path, monkeypatch, serve):
    served = tmp_path / "served"
    os.makedirs(served)
    for n in NAMES:
        shutil.copy(f"{BUNDLED}/{n}.gz", served)
    (served / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x01\x07"))
    bad = serve(served)
    monkeypatch.setattr(mnist, "DOWNLOAD_FROM_BUNDLED", False)
    monkeypatch.setitem(mnist.MIRRORS, "MNIST", [bad.url])
    with pytest.raises(RuntimeError) as info:
        MNIST(root=tmp_path / "root", train=False, download=True)
    message = str(info.value)
    assert f"{bad.url}t10k-labels-idx1-ubyte.gz: checksum mismatch" in message
    assert "ec29112dd5afa0611ce80d1b7f02629c" in message
    left = os.listdir(tmp_path / "root" / "MNIST" / "raw")
    assert "t10k-labels-idx1-ubyte.gz" not in left and not [f for f in left if f.endswith(".tmp")]


def test_unreachable_and_404_mirrors_are_skipped_then_reported(tmp_path, monkeypatch, serve, unreachable_url,
                                                                 good_mirror):
    empty = serve(tmp_path / "empty")
    monkeypatch.setattr(mnist, "DOWNLOAD_FROM_BUNDLED", False)
    monkeypatch.setitem(mnist.MIRRORS, "MNIST", [unreachable_url, empty.url, good_mirror.url])
    assert len(MNIST(root=tmp_path / "a", train=False, download=True)) == 10000
    monkeypatch.setattr(mnist, "DOWNLOAD_FROM_BUNDLED", False)
    monkeypatch.setitem(mnist.MIRRORS, "MNIST", [unreachable_url, empty.url])
    with pytest.raises(RuntimeError) as info:
        MNIST(root=tmp_path / "b", train=False, download=True)
    message = str(info.value)
    assert "could not download train-images-idx3-ubyte.gz" in message
    assert f"{unreachable_url}train-images-idx3-ubyte.gz: ConnectionRefusedError" in message
    assert f"{empty.url}train-images-idx3-ubyte.gz: HTTP 404" in message
    assert not os.path.exists(tmp_path / "b" / "MNIST" / "raw" / "train-images-idx3-ubyte.gz")


def test_fashion_mnist_downloads_into_its_own_folder(tmp_path, monkeypatch, good_mirror):
    # the real Fashion-MNIST MD5s cannot be served offline: accept the bundled MNIST files for this test
    monkeypatch.setattr(FashionMNIST, "resources", MNIST.resources)
    monkeypatch.setattr(mnist, "DOWNLOAD_FROM_BUNDLED", False)
    monkeypatch.setitem(mnist.MIRRORS, "FashionMNIST", [good_mirror.url])
    ds = FashionMNIST(root=tmp_path, train=False, download=True)
    assert len(ds) == 10000 and os.path.isdir(tmp_path / "FashionMNIST" / "raw")
    assert repr(ds).startswith("Dataset FashionMNIST\n")


def test_download_without_network_uses_the_bundled_copy(tmp_path, monkeypatch):
    monkeypatch.setitem(mnist.MIRRORS, "MNIST", ["http://127.0.0.1:9/"])  # nothing listens on the discard port
    ds = mnist.MNIST(str(tmp_path), train=False, download=True)
    assert len(ds) == 10000
    assert sorted(os.listdir(tmp_path / "MNIST" / "raw")) == sorted(
        n + ".gz" for n in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "train-images-idx3-ubyte",
                            "train-labels-idx1-ubyte"))
