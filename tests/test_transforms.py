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
