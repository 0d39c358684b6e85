"""Tests for smalltrain.transforms: values bit-equal to torchvision's arithmetic (written in torch), its error
types and messages, reprs, and the batched path equal to the per-sample one."""
import numpy as np
import pytest
import torch

import smalltrain
from smalltrain import transforms as T


def uint8_image(*shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def torch_to_tensor(pic):
    """torchvision.transforms.functional.to_tensor for ndarrays."""
    if pic.ndim == 2:
        pic = pic[:, :, None]
    img = torch.from_numpy(pic.transpose((2, 0, 1))).contiguous()
    return img.to(dtype=torch.get_default_dtype()).div(255) if img.dtype == torch.uint8 else img


def torch_normalize(t, mean, std):
    """torchvision.transforms.functional.normalize."""
    t = t.clone()
    mean = torch.as_tensor(mean, dtype=t.dtype).view(-1, 1, 1)
    std = torch.as_tensor(std, dtype=t.dtype).view(-1, 1, 1)
    return t.sub_(mean).div_(std)


@pytest.mark.parametrize("shape", [(28, 28), (5, 7), (5, 7, 3), (4, 6, 1)])
def test_to_tensor_uint8_matches_torchvision(shape):
    pic = uint8_image(*shape)
    pic.flat[:2] = [0, 255]
    out = T.ToTensor()(pic)
    ref = torch_to_tensor(pic)
    assert isinstance(out, smalltrain.Tensor) and out.dtype == smalltrain.float32
    assert tuple(out.shape) == tuple(ref.shape)
    np.testing.assert_array_equal(out.numpy(), ref.numpy())


def test_to_tensor_keeps_other_dtypes_and_copies():
    pic = np.arange(24, dtype=np.float64).reshape(2, 4, 3)
    out = T.ToTensor()(pic)
    assert out.dtype == smalltrain.float64
    np.testing.assert_array_equal(out.numpy(), torch_to_tensor(pic).numpy())
    assert out.numpy().flags.c_contiguous


def test_to_tensor_errors_match_torchvision():
    with pytest.raises(TypeError, match="pic should be PIL Image or ndarray. Got <class 'list'>"):
        T.ToTensor()([[1, 2]])
    with pytest.raises(ValueError, match="pic should be 2/3 dimensional. Got 4 dimensions."):
        T.ToTensor()(np.zeros((1, 2, 3, 4), np.uint8))


def test_normalize_matches_torchvision_per_channel():
    img = T.ToTensor()(uint8_image(5, 7, 3, seed=1))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    out = T.Normalize(mean, std)(img)
    np.testing.assert_array_equal(out.numpy(), torch_normalize(torch.from_numpy(img.numpy()), mean, std).numpy())
    assert not np.array_equal(out.numpy(), img.numpy())           # not in place by default
    batch = smalltrain.from_numpy(np.random.default_rng(2).standard_normal((2, 3, 4, 5)))
    out = T.Normalize([1.0, 2.0, 3.0], [0.5, 2.0, 4.0])(batch)    # float64 stays float64, leading dims broadcast
    assert out.dtype == smalltrain.float64
    np.testing.assert_array_equal(out.numpy(), torch_normalize(torch.from_numpy(batch.numpy()), [1.0, 2.0, 3.0],
                                                               [0.5, 2.0, 4.0]).numpy())


def test_normalize_in_place():
    img = T.ToTensor()(uint8_image(4, 4))
    before = img.numpy().copy()
    out = T.Normalize((0.5,), (0.25,), inplace=True)(img)
    assert out is img
    np.testing.assert_array_equal(img.numpy(), (before - np.float32(0.5)) / np.float32(0.25))


def test_normalize_errors_match_torchvision():
    with pytest.raises(TypeError, match="img should be Tensor Image"):
        T.Normalize((0.5,), (0.5,))(np.zeros((1, 2, 2), np.float32))
    with pytest.raises(TypeError, match="Input tensor should be a float tensor. Got smalltrain.uint8."):
        T.Normalize((0.5,), (0.5,))(smalltrain.zeros(1, 2, 2, dtype=smalltrain.uint8))
    with pytest.raises(ValueError, match=r"Expected tensor to be a tensor image of size \(..., C, H, W\)"):
        T.Normalize((0.5,), (0.5,))(smalltrain.zeros(2, 2))
    with pytest.raises(TypeError, match="Tensor is not a torch image."):
        T.Normalize((0.5,), (0.5,))(smalltrain.zeros(2))
    with pytest.raises(ValueError, match="std evaluated to zero after conversion to smalltrain.float32"):
        T.Normalize((0.5, 0.5), (1.0, 0.0))(smalltrain.zeros(2, 2, 2))


def test_compose_lambda_and_reprs():
    c = T.Compose([T.ToTensor(), T.Normalize((0.1307,), (0.3081,)), T.Lambda(lambda t: t * 2)])
    assert repr(c) == "Compose(\n    ToTensor()\n    Normalize(mean=(0.1307,), std=(0.3081,))\n    Lambda()\n)"
    pic = uint8_image(6, 6)
    expected = torch_normalize(torch_to_tensor(pic), (0.1307,), (0.3081,)) * 2
    np.testing.assert_array_equal(c(pic).numpy(), expected.numpy())
    assert repr(T.Compose([])) == "Compose(\n)" and T.Compose([])(pic) is pic
    with pytest.raises(TypeError, match="Argument lambd should be callable, got 'int'"):
        T.Lambda(3)


@pytest.mark.parametrize("transform", [T.ToTensor(), T.Compose([T.ToTensor(), T.Normalize((0.2,), (0.7,))]),
                                       T.Compose([T.Compose([T.ToTensor()]), T.Normalize((0.2,), (0.7,))])],
                         ids=["totensor", "compose", "nested"])
@pytest.mark.parametrize("sample_shape", [(6, 5), (6, 5, 1)])
def test_apply_batch_equals_per_sample(transform, sample_shape):
    batch = uint8_image(4, *sample_shape, seed=3)
    out = T.apply_batch(transform, batch)
    assert isinstance(out, smalltrain.Tensor) and tuple(out.shape) == (4, 1, 6, 5)
    np.testing.assert_array_equal(out.numpy(), np.stack([transform(b).numpy() for b in batch]))
    assert out.numpy().flags.c_contiguous


@pytest.mark.parametrize("transform", [T.Lambda(lambda a: a), T.Normalize((0.5,), (0.5,)),
                                       T.Compose([T.ToTensor(), T.Lambda(lambda t: t)]), T.Compose([])],
                         ids=["lambda", "normalize-first", "compose-lambda", "empty"])
def test_apply_batch_declines_what_it_cannot_vectorize(transform):
    assert T.apply_batch(transform, uint8_image(2, 3, 3)) is None


# ---- random augmentations (torchvision is not installed: its geometry is written here in torch, as its tensor
# backend does it: affine grid in centred pixel coordinates, grid_sample(align_corners=False), a mask channel for
# fill), and properties: identity, exact pixel moves, flips, crop windows, reproducibility ----

from smalltrain.transforms import functional as TF  # noqa: E402


def torchvision_affine(img, matrix, mode, fill):
    """torchvision.transforms._functional_tensor.affine for an [N, C, H, W] float tensor and one matrix."""
    n, c, h, w = img.shape
    theta = torch.tensor(matrix, dtype=img.dtype).reshape(1, 2, 3)
    base = torch.empty(1, h, w, 3, dtype=img.dtype)
    base[..., 0].copy_(torch.linspace(-w * 0.5 + 0.5, w * 0.5 + 0.5 - 1, steps=w))
    base[..., 1].copy_(torch.linspace(-h * 0.5 + 0.5, h * 0.5 + 0.5 - 1, steps=h).unsqueeze_(-1))
    base[..., 2].fill_(1)
    grid = base.view(1, h * w, 3).bmm(theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], dtype=img.dtype))
    grid = grid.view(1, h, w, 2).expand(n, h, w, 2)
    out = torch.nn.functional.grid_sample(torch.cat([img, torch.ones(n, 1, h, w, dtype=img.dtype)], 1), grid,
                                          mode=mode, padding_mode="zeros", align_corners=False)
    mask, out = out[:, -1:].expand(n, c, h, w), out[:, :-1]
    fill_img = torch.full_like(out, float(fill))
    if mode == "nearest":
        return torch.where(mask < 0.5, fill_img, out)
    return out * mask + (1.0 - mask) * fill_img


AFFINE_CASES = [  # (angle, translate, scale, shear)
    (30.0, (0, 0), 1.0, (0.0, 0.0)), (-17.0, (2, -1), 1.1, (0.0, 0.0)), (12.0, (1, 3), 0.8, (10.0, -5.0)),
    (0.0, (0, 0), 1.0, (20.0, 0.0)), (90.0, (0, 0), 1.0, (0.0, 0.0)),
]


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
@pytest.mark.parametrize("case", range(len(AFFINE_CASES)))
@pytest.mark.parametrize("size", [(9, 9), (8, 11)])
def test_affine_matches_torchvision_geometry(case, mode, size):
    if mode == "nearest" and AFFINE_CASES[case][0] == 90.0 and size[0] != size[1]:
        pytest.skip("a quarter turn of a non-square image lands on half pixels: nearest's ties follow rounding noise")
    img = np.random.default_rng(case).uniform(0, 1, (2, 3) + size).astype(np.float32)
    matrix = TF.inverse_affine_matrix(*AFFINE_CASES[case])
    ours = TF.affine(img, [matrix] * 2, mode, fill=0.5)
    ref = torchvision_affine(torch.from_numpy(img), matrix, mode, 0.5).numpy()
    np.testing.assert_allclose(ours, ref, atol=2e-5)


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_rotation_by_90_moves_pixels_exactly(mode):
    img = uint8_image(7, 7)
    out = T.RandomRotation((90, 90), interpolation=mode)(img)
    np.testing.assert_array_equal(out, np.rot90(img, 1))   # counter-clockwise, as torchvision's rotate
    even = uint8_image(6, 6, 3, seed=1)
    np.testing.assert_array_equal(T.RandomRotation((-90, -90), interpolation=mode)(even), np.rot90(even, -1))


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_zero_degrees_and_zero_translation_is_identity(mode):
    img = uint8_image(5, 8)
    np.testing.assert_array_equal(T.RandomRotation(0, interpolation=mode)(img), img)
    np.testing.assert_array_equal(T.RandomAffine(0, translate=(0, 0), interpolation=mode)(img), img)
    t = smalltrain.tensor(uint8_image(2, 5, 8).astype(np.float32))
    np.testing.assert_array_equal(T.RandomAffine(0, interpolation=mode)(t).numpy(), t.numpy())


def test_integer_translation_shifts_and_fills():
    img = np.arange(1, 21, dtype=np.float32).reshape(1, 1, 4, 5)
    out = TF.affine(img, [TF.inverse_affine_matrix(0.0, (2, -1), 1.0, (0.0, 0.0))], "nearest", fill=-1)
    expected = np.full_like(img, -1)
    expected[..., :3, 2:] = img[..., 1:, :3]    # right by 2, up by 1
    np.testing.assert_array_equal(out, expected)


def test_random_affine_translation_is_whole_pixels_per_sample():
    smalltrain.manual_seed(3)
    batch = np.zeros((16, 9, 9), np.uint8)
    batch[:, 4, 4] = 255
    out = T.RandomAffine(0, translate=(0.25, 0.25)).per_sample(batch)
    ys, xs = [], []
    for sample in out:
        (y,), (x,) = np.nonzero(sample)
        ys.append(y - 4)
        xs.append(x - 4)
    assert max(map(abs, xs)) <= 2 and max(map(abs, ys)) <= 2     # |t| <= 0.25 * 9, rounded
    assert len(set(zip(xs, ys))) > 1                              # each sample its own draw


def test_horizontal_flip():
    img = uint8_image(4, 6, 3)
    np.testing.assert_array_equal(T.RandomHorizontalFlip(1.0)(img), img[:, ::-1])
    np.testing.assert_array_equal(T.RandomHorizontalFlip(0.0)(img), img)
    flip = T.RandomHorizontalFlip(1.0)
    np.testing.assert_array_equal(flip(flip(img)), img)
    smalltrain.manual_seed(0)
    batch = uint8_image(32, 5, 5)
    out = T.RandomHorizontalFlip().per_sample(batch)
    flipped = [bool((o == b[:, ::-1]).all()) for o, b in zip(out, batch)]
    kept = [bool((o == b).all()) for o, b in zip(out, batch)]
    assert all(f or k for f, k in zip(flipped, kept)) and 0 < sum(flipped) < 32


@pytest.mark.parametrize("padding_mode", ["constant", "edge", "reflect", "symmetric"])
def test_random_crop_windows_lie_in_the_padded_image(padding_mode):
    smalltrain.manual_seed(1)
    batch = np.arange(8 * 6 * 6, dtype=np.float32).reshape(8, 6, 6)
    crop = T.RandomCrop(6, padding=2, fill=-1, padding_mode=padding_mode)
    out = crop.per_sample(batch)
    padded = np.pad(batch, ((0, 0), (2, 2), (2, 2)), mode=padding_mode,
                    **({"constant_values": -1} if padding_mode == "constant" else {}))
    offsets = set()
    for k in range(8):
        found = [(i, j) for i in range(5) for j in range(5) if (padded[k, i:i + 6, j:j + 6] == out[k]).all()]
        assert found, f"sample {k}: the crop is no window of the padded image"
        offsets.add(found[0])
    assert len(offsets) > 1


def test_random_crop_pad_if_needed_and_errors():
    img = uint8_image(4, 5)
    assert T.RandomCrop((6, 7), pad_if_needed=True)(img).shape == (6, 7)
    with pytest.raises(ValueError, match="larger than input image size"):
        T.RandomCrop(6)(img)
    with pytest.raises(ValueError, match="Padding mode"):
        T.RandomCrop(4, padding=1, padding_mode="wrap")
    with pytest.raises(ValueError, match="positive"):
        T.RandomRotation(-5)


def test_augmentation_reproducible_with_seed_and_generator():
    batch = uint8_image(4, 10, 10)
    aug = T.Compose([T.RandomCrop(8, padding=1), T.RandomHorizontalFlip(), T.RandomAffine(15, scale=(0.9, 1.1)),
                     T.ToTensor()])
    smalltrain.manual_seed(5)
    first = T.apply_batch(aug, batch)
    smalltrain.manual_seed(5)
    again = T.apply_batch(aug, batch)
    assert first.shape == (4, 1, 8, 8)
    np.testing.assert_array_equal(first.numpy(), again.numpy())
    rot = T.RandomRotation(30, interpolation="bilinear")
    a = rot.per_sample(batch, generator=smalltrain.Generator().manual_seed(2))
    b = rot.per_sample(batch, generator=smalltrain.Generator().manual_seed(2))
    np.testing.assert_array_equal(a, b)


def test_batched_path_equals_per_sample_calls_with_the_same_draws():
    """apply_batch draws per sample in one call; a Tensor batch through per_sample matches the array path."""
    batch = uint8_image(3, 9, 9)
    rot = T.RandomRotation(40)
    arr = rot.per_sample(batch, generator=smalltrain.Generator().manual_seed(4))
    ten = rot.per_sample(smalltrain.tensor(batch[:, None]), generator=smalltrain.Generator().manual_seed(4))
    np.testing.assert_array_equal(ten.numpy()[:, 0], arr)


@pytest.mark.parametrize("make", [lambda: T.RandomCrop(7, padding=1), lambda: T.RandomHorizontalFlip(),
                                  lambda: T.RandomAffine(20, translate=(0.1, 0.2), scale=(0.9, 1.1), shear=5,
                                                         interpolation="bilinear")])
def test_per_sample_on_device_tensors_matches_cpu(make, device):
    batch = np.random.default_rng(0).uniform(0, 1, (4, 2, 7, 7)).astype(np.float32)
    cpu = make().per_sample(smalltrain.tensor(batch), generator=smalltrain.Generator().manual_seed(9))
    dev = make().per_sample(smalltrain.tensor(batch, device=device), generator=smalltrain.Generator().manual_seed(9))
    assert dev.device.type == device
    np.testing.assert_allclose(dev.numpy(force=True), cpu.numpy(), rtol=1e-6, atol=1e-6)
