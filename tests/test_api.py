"""The torch-level API around tensors, against torch where torch has the thing: torch.Generator's counterpart (and
every place that takes one), torch.backends and torch.accelerator, thread controls, and torch's import surface."""
import subprocess
import sys

import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.utils.data import DataLoader, RandomSampler, TensorDataset, random_split


def test_generator_matches_torch_for_integers_and_shuffles():
    ours, theirs = st.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert st.randperm(10, generator=ours).tolist() == torch.randperm(10, generator=theirs).tolist()
    assert st.randint(0, 50, (6,), generator=ours).tolist() == torch.randint(0, 50, (6,), generator=theirs).tolist()
    assert ours.initial_seed() == theirs.initial_seed() == 7
    assert st.Generator().initial_seed() == torch.Generator().initial_seed()


def test_generator_in_data_utilities_matches_torch():
    data = np.arange(10, dtype=np.float32)
    ours = DataLoader(TensorDataset(st.tensor(data)), batch_size=4, shuffle=True,
                      generator=st.Generator().manual_seed(3))
    theirs = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.tensor(data)), batch_size=4,
                                         shuffle=True, generator=torch.Generator().manual_seed(3))
    assert [b[0].tolist() for b in ours] == [b[0].tolist() for b in theirs]
    split_ours = random_split(range(10), [3, 7], generator=st.Generator().manual_seed(1))
    split_theirs = torch.utils.data.random_split(range(10), [3, 7], generator=torch.Generator().manual_seed(1))
    assert [list(s) for s in split_ours] == [list(s) for s in split_theirs]
    sampled = list(RandomSampler(range(8), generator=st.Generator().manual_seed(5)))
    assert sampled == list(torch.utils.data.RandomSampler(range(8), generator=torch.Generator().manual_seed(5)))


def _draws(g, device):
    t = st.empty(3, device=device)
    return (st.randn(2, 3, generator=g, device=device).tolist(), st.rand(4, generator=g, device=device).tolist(),
            t.normal_(1.0, 2.0, generator=g).tolist(), t.uniform_(-1, 1, generator=g).tolist())


def test_generator_reproducible_and_state_roundtrip(device):
    g = st.Generator(device=device).manual_seed(11)
    assert g.device.type == device
    first = _draws(g, device)
    assert _draws(st.Generator(device=device).manual_seed(11), device) == first
    state = g.get_state()
    after = _draws(g, device)
    assert after != first
    g.set_state(state)
    assert _draws(g, device) == after
    st.manual_seed(0)
    global_before = st.randn(3).tolist()
    st.manual_seed(0)
    _draws(st.Generator().manual_seed(1), "cpu")   # a private generator leaves the global stream alone
    assert st.randn(3).tolist() == global_before


def test_generator_seed_is_fresh_and_recorded():
    g = st.Generator()
    s = g.seed()
    assert isinstance(s, int) and g.initial_seed() == s
    assert st.randperm(20, generator=st.Generator().manual_seed(s)).tolist() == \
        st.randperm(20, generator=g).tolist()


def test_backends_and_accelerator():
    cudnn = st.backends.cudnn
    cudnn.benchmark, cudnn.deterministic = True, True   # accepted, as scripts set them
    assert cudnn.benchmark and cudnn.deterministic and cudnn.enabled
    assert st.backends.mps.is_available() is False and torch.backends.mps.is_available() is False
    assert st.accelerator.is_available() == st.cuda.is_available()
    assert st.accelerator.device_count() == (st.cuda.device_count() if st.cuda.is_available() else 0)
    acc = st.accelerator.current_accelerator()
    assert (acc is None) if not st.cuda.is_available() else acc.type == "cuda"


def test_allow_tf32_is_what_cublas_gets(monkeypatch):
    monkeypatch.delenv("CUPY_TF32", raising=False)
    matmul = st.backends.cuda.matmul
    was = matmul.allow_tf32
    try:
        matmul.allow_tf32 = True
        assert matmul.allow_tf32 and st.get_float32_matmul_precision() == "high"
        st.set_float32_matmul_precision("highest")
        assert not matmul.allow_tf32
        with pytest.raises(RuntimeError, match="highest"):
            st.set_float32_matmul_precision("fast")
    finally:
        matmul.allow_tf32 = was


def test_thread_controls():
    before = st.get_num_threads()
    try:
        st.set_num_threads(1)
        assert st.get_num_threads() == 1
    finally:
        st.set_num_threads(before)
    st.set_num_interop_threads(2)
    assert st.get_num_interop_threads() == 2
    with pytest.raises(RuntimeError):
        st.set_num_threads(0)


def test_utils_data_reachable_after_plain_import():
    code = "import smalltrain; print(smalltrain.utils.data.DataLoader.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "DataLoader"
