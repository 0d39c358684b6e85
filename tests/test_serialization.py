"""Tests for smalltrain.save/load (smalltrain/serialization/): round trips, files written by PyTorch and by the
safetensors library, malicious pickles refused, atomic and exact writes, corrupt files named, map_location, and the
trainer's checkpoints (save_training_state, load_training_state, read_checkpoint_meta)."""
import io
import json
import math
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import safetensors.torch
import torch

import smalltrain as st
from smalltrain import nn, optim
from smalltrain.models import LeNet5
from smalltrain.serialization import (CheckpointError, UnsafePickleError, load_training_state, read_checkpoint_meta,
                                      save_training_state)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_model():
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def train_steps(model, opt, steps=2):
    for i in range(steps):
        opt.zero_grad()
        out = model(st.tensor(np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3) * (i + 1)))
        (out * out).sum().backward()
        opt.step()


def params(model):
    return [p.numpy(force=True).copy() for p in model.parameters()]


def assert_same_tree(got, expected, where="obj"):
    assert type(got) is type(expected), f"{where}: {type(got)} != {type(expected)}"
    if isinstance(expected, dict):
        assert list(got) == list(expected), where
        for key in expected:
            assert_same_tree(got[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same_tree(g, e, f"{where}[{i}]")
    elif isinstance(expected, st.Tensor):
        assert got.dtype == expected.dtype and got.shape == expected.shape, where
        assert got.requires_grad == expected.requires_grad and got.device == st.device("cpu"), where
        assert got.numpy(force=True).tobytes() == expected.numpy(force=True).tobytes(), where
    elif isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(got), where
    else:
        assert got == expected and str(got) == str(expected), where   # str: -0.0 vs 0.0


def test_nested_training_dict_with_every_scalar_kind_round_trips(tmp_path):
    obj = {"epoch": 3, "big": -(2 ** 80), "lr": 0.1, "neg_zero": -0.0, "tiny": 5e-324, "nan": float("nan"),
           "inf": float("inf"), "ninf": float("-inf"), "flag": True, "none": None, "name": "réseau ∑",
           "betas": (0.9, 0.999), "empty": {}, "nested": [[], (), [1, [2.5, (None,)]]], 7: {-1: "int keys"},
           "ordered": OrderedDict(b=1, a=2),
           "tensors": {str(d): st.tensor(np.arange(6).reshape(2, 3) % 2, dtype=d)
                       for d in (st.float32, st.float64, st.float16, st.int64, st.int32, st.int16, st.int8,
                                 st.uint8, st.bool)},
           "scalar": st.tensor(2.5), "empty_t": st.zeros(0, 4), "grad": st.ones(2, requires_grad=True),
           "param": nn.Parameter(st.full((2,), -1.5))}
    path = tmp_path / "state.pt"
    st.save(obj, path)
    back = st.load(path)
    assert_same_tree(back, obj)
    assert isinstance(back["param"], nn.Parameter) and not isinstance(back["grad"], nn.Parameter)
    assert os.listdir(tmp_path) == ["state.pt"]


def test_model_state_dict_round_trip_gives_the_same_outputs(tmp_path):
    model, other = LeNet5(), LeNet5()
    st.save(model.state_dict(), tmp_path / "model.pt")
    state = st.load(tmp_path / "model.pt")
    assert isinstance(state, OrderedDict) and list(state) == list(model.state_dict())
    other.load_state_dict(state)
    x = st.randn(2, 1, 28, 28)
    np.testing.assert_array_equal(other(x).numpy(force=True), model(x).numpy(force=True))
    # the file is an ordinary safetensors file with torch's key names
    flat = safetensors.torch.load_file(str(tmp_path / "model.pt"))
    assert sorted(flat) == sorted(model.state_dict()) and flat["fc3.bias"].numpy().tobytes() == \
        model.fc3.bias.numpy(force=True).tobytes()


@pytest.mark.parametrize("make_opt", [lambda p: optim.SGD(p, lr=0.1, momentum=0.9),
                                      lambda p: optim.Adam(p, lr=0.01, betas=(0.8, 0.9))], ids=["sgd", "adam"])
def test_optimizer_state_dict_round_trip_continues_identically(tmp_path, make_opt):
    model = small_model()
    opt = make_opt(model.parameters())
    train_steps(model, opt)
    st.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt.pt")
    saved = opt.state_dict()

    resumed = small_model()
    resumed_opt = make_opt(resumed.parameters())
    back = st.load(tmp_path / "ckpt.pt")
    assert_same_tree(back["opt"], saved)
    resumed.load_state_dict(back["model"])
    resumed_opt.load_state_dict(back["opt"])
    train_steps(model, opt)
    train_steps(resumed, resumed_opt)
    for a, b in zip(params(model), params(resumed)):
        assert a.tobytes() == b.tobytes()


class TorchLeNet5(torch.nn.Module):
    """torch's twin of smalltrain.models.LeNet5: same layers, same names."""

    def __init__(self):
        super().__init__()
        self.conv1, self.pool1 = torch.nn.Conv2d(1, 6, 5), torch.nn.MaxPool2d(2)
        self.conv2, self.pool2 = torch.nn.Conv2d(6, 16, 5), torch.nn.MaxPool2d(2)
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(256, 120), torch.nn.Linear(120, 84), torch.nn.Linear(84, 10)

    def forward(self, x):
        gelu = torch.nn.functional.gelu
        x = self.pool1(gelu(self.conv1(x)))
        x = self.pool2(gelu(self.conv2(x))).flatten(1)
        return self.fc3(gelu(self.fc2(gelu(self.fc1(x)))))


def test_state_dict_saved_by_pytorch_loads_into_our_model(tmp_path):
    torch.manual_seed(0)
    torch_model = TorchLeNet5()
    path = tmp_path / "lenet.pth"
    torch.save(torch_model.state_dict(), path)
    model = LeNet5()
    state = st.load(path, weights_only=True)
    assert isinstance(state, OrderedDict) and list(state) == list(torch_model.state_dict())
    model.load_state_dict(state)
    x = np.random.default_rng(0).standard_normal((3, 1, 28, 28)).astype(np.float32)
    expected = torch_model(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(model(st.tensor(x)).numpy(force=True), expected, rtol=0, atol=1e-6)


def test_pytorch_file_with_views_parameters_and_containers(tmp_path):
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    obj = {"t": base.t(), "slice": base[1:, 2:5:2], "expanded": torch.tensor([1, 2]).expand(3, 2),
           "param": torch.nn.Parameter(torch.ones(2)), "half": torch.tensor([1.5], dtype=torch.float16),
           "mask": torch.tensor([True, False]), "long": torch.tensor(-7), "size": torch.Size([2, 3]),
           "steps": [1, 2.5, None, "s", (True,)], "od": OrderedDict(k=torch.zeros(0, 3))}
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    back = st.load(buffer)
    for key in ("t", "slice", "expanded", "half", "mask", "long"):
        np.testing.assert_array_equal(back[key].numpy(), obj[key].numpy())
        assert str(back[key].dtype).split(".")[1] == str(obj[key].dtype).split(".")[1]
    assert isinstance(back["param"], nn.Parameter) and back["param"].requires_grad
    assert back["size"] == (2, 3) and back["steps"] == [1, 2.5, None, "s", (True,)]
    assert isinstance(back["od"], OrderedDict) and back["od"]["k"].shape == (0, 3)


def test_plain_safetensors_file_from_the_library_loads(tmp_path):
    tensors = {"encoder.weight": torch.randn(3, 2), "ids": torch.arange(4), "mask": torch.tensor([True, False])}
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    back = st.load(tmp_path / "model.safetensors")
    assert sorted(back) == sorted(tensors)
    for key, value in tensors.items():
        np.testing.assert_array_equal(back[key].numpy(), value.numpy())


def malicious_pt(path, payload):
    class Evil:
        def __reduce__(self):
            return payload
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"weights": [Evil()]}, protocol=2))
        z.writestr("archive/byteorder", "little")


@pytest.mark.parametrize("weights_only", [True, False])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, weights_only):
    marker = tmp_path / "pwned"
    cases = [(os.system, (f"touch {marker}",)), (exec, (f"open({str(marker)!r}, 'w').close()",)),
             (subprocess.call, (["touch", str(marker)],))]
    for i, payload in enumerate(cases):
        path = tmp_path / f"evil{i}.pt"
        malicious_pt(path, payload)
        with pytest.raises(pickle.UnpicklingError) as info:
            st.load(path, weights_only=weights_only)
        name = f"{payload[0].__module__}.{payload[0].__name__}"
        assert f"refusing to load the global {name}" in str(info.value) and str(path) in str(info.value)
        assert isinstance(info.value, UnsafePickleError) and isinstance(info.value, ValueError)
    assert not marker.exists()


class _StorageRef:
    """Pickled as a persistent id, as torch.save pickles a storage."""


class _ViewOf:
    def __init__(self, size, stride, offset=0):
        self.args = (_StorageRef(), offset, size, stride, False, OrderedDict())

    def __reduce__(self):
        return torch._utils._rebuild_tensor_v2, self.args


def crafted_pt(path, obj, storage=np.arange(2, dtype=np.float32), compress=zipfile.ZIP_STORED):
    """A torch.save-style zip whose data.pkl holds `obj`; every _StorageRef is float storage '0'."""
    class Pickler(pickle.Pickler):
        def persistent_id(self, value):
            return ("storage", torch.FloatStorage, "0", "cpu", storage.size) if isinstance(value, _StorageRef) \
                else None
    buffer = io.BytesIO()
    Pickler(buffer, protocol=2).dump(obj)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", buffer.getvalue(), compress_type=compress)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", storage.tobytes())


def test_crafted_tensor_views_are_bounds_checked(tmp_path):
    path = tmp_path / "view.pt"
    crafted_pt(path, {"ok": _ViewOf((2, 2), (0, 1))})
    assert st.load(path)["ok"].tolist() == [[0.0, 1.0], [0.0, 1.0]]
    for view in (_ViewOf((3,), (1,)), _ViewOf((2,), (1,), offset=1), _ViewOf((2, 2), (2, 1))):
        crafted_pt(path, {"bad": view})
        with pytest.raises(CheckpointError, match="view.pt: a tensor of size .* runs past its storage of 2"):
            st.load(path)
    crafted_pt(path, {"ok": _ViewOf((2,), (1,))}, compress=zipfile.ZIP_DEFLATED)
    with pytest.raises(CheckpointError, match="data.pkl is compressed"):
        st.load(path)


def test_build_opcode_cannot_alter_smalltrain_objects(tmp_path):
    # GLOBAL torch.float32, then BUILD with slot state {'np': 'x'}: setattr on whatever find_class returned
    data = (b"\x80\x02ctorch\nfloat32\nN}X\x02\x00\x00\x00npX\x01\x00\x00\x00xs\x86b.")
    with zipfile.ZipFile(tmp_path / "build.pt", "w") as z:
        z.writestr("archive/data.pkl", data)
    loaded = st.load(tmp_path / "build.pt")
    assert loaded.np == "x" and loaded is not st.float32 and st.float32.np == np.dtype(np.float32)


def test_whole_pytorch_module_is_refused(tmp_path):
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    with pytest.raises(pickle.UnpicklingError, match="global torch.nn.modules.linear.Linear"):
        st.load(tmp_path / "module.pt")


def test_legacy_pytorch_format_is_refused_clearly(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="legacy .* re-save it with a current torch"):
        st.load(tmp_path / "old.pt")


def test_save_touches_no_other_file(tmp_path):
    sidecar = tmp_path / "model.json"
    sidecar.write_text('{"mine": true}')
    st.save(small_model().state_dict(), tmp_path / "model.pt")
    st.save(small_model().state_dict(), tmp_path / "model.pt")   # overwrite too
    assert sidecar.read_text() == '{"mine": true}' and sorted(os.listdir(tmp_path)) == ["model.json", "model.pt"]


@pytest.mark.parametrize("obj, message", [
    ({"opt": {"state": {0: {1, 2}}}}, r"obj\['opt'\]\['state'\]\[0\]: cannot save <class 'set'>"),
    ({"w": [st.ones(1), np.ones(2)]}, r"obj\['w'\]\[1\]: cannot save <class 'numpy.ndarray'>"),
    ({(1, 2): 3}, r"obj: cannot save a dict key \(1, 2\)"),
    (b"bytes", r"obj: cannot save <class 'bytes'>"),
])
def test_unsupported_object_names_its_place_and_writes_nothing(tmp_path, obj, message):
    path = tmp_path / "x.pt"
    path.write_bytes(b"previous")
    with pytest.raises(TypeError, match=message):
        st.save(obj, path)
    assert os.listdir(tmp_path) == ["x.pt"] and path.read_bytes() == b"previous"


def test_file_mode_follows_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        st.save({"a": 1}, tmp_path / "a.pt")
    finally:
        os.umask(old)
    assert (tmp_path / "a.pt").stat().st_mode & 0o777 == 0o640


def test_missing_parent_directory_is_an_error_as_in_torch(tmp_path):
    with pytest.raises(RuntimeError, match="Parent directory .*nowhere does not exist"):
        st.save({"a": 1}, tmp_path / "nowhere" / "a.pt")
    assert os.listdir(tmp_path) == []


def test_killed_writer_leaves_the_old_file_loadable_and_its_temp_is_cleaned(tmp_path):
    path = tmp_path / "ckpt.pt"
    st.save({"epoch": 1}, path)
    code = ("import os, signal, sys, smalltrain.utils.io as io_\n"
            "with io_.atomic_write(sys.argv[1]) as f:\n"
            "    f.write(b'half a checkpoint'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n")
    assert subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO).returncode == -9
    assert len(os.listdir(tmp_path)) == 2
    assert st.load(path) == {"epoch": 1}            # loads ignore the temporary
    with pytest.warns(RuntimeWarning, match="interrupted write"):
        st.save({"epoch": 2}, path)
    assert os.listdir(tmp_path) == ["ckpt.pt"] and st.load(path) == {"epoch": 2}


def test_truncated_or_garbage_files_are_refused_with_their_name(tmp_path):
    path = tmp_path / "ckpt.pt"
    st.save(small_model().state_dict(), path)
    data = path.read_bytes()
    for bad in (data[:-7], data[:5], b"", b"garbage" * 10):
        path.write_bytes(bad)
        with pytest.raises(CheckpointError, match="ckpt.pt"):
            st.load(path)
    torch.save({"w": torch.ones(3)}, tmp_path / "t.pt")
    (tmp_path / "t.pt").write_bytes((tmp_path / "t.pt").read_bytes()[:-30])
    with pytest.raises(CheckpointError, match="t.pt"):
        st.load(tmp_path / "t.pt")


def edit_header(path, change):
    data = path.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    envelope = json.loads(header["__metadata__"]["smalltrain"])
    change(header, envelope["document"]["structure"])
    header["__metadata__"]["smalltrain"] = json.dumps(envelope)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + size:])


def tensor_node(structure, key):
    return next(v for k, v in structure["dict"] if k == key)


def set_dtype(header, structure):
    header["w"]["dtype"] = "I32"       # same byte length as F32: only the structure's record can tell


@pytest.mark.parametrize("change, message", [
    (set_dtype, "recorded as float32 \\[2, 3\\], but the safetensors header says I32"),
    (lambda h, s: tensor_node(s, "w").update(tensor="gone"), "names tensor 'gone', which the file does not hold"),
    (lambda h, s: tensor_node(s, "w").update(shape=[3, 2]), "recorded as float32 \\[3, 2\\]"),
    (lambda h, s: s["dict"].append(["x", {"set": [1]}]), "unknown tag 'set'"),
    (lambda h, s: s["dict"].append(["x", [1, 2]]), "expected a scalar or a tagged object, got list"),
    (lambda h, s: s["dict"].append(["w", 1]), "repeats"),
    (lambda h, s: s["dict"].pop(0), "tensor 'w' of the file is not named by the structure"),
    (lambda h, s: tensor_node(s, "w").update(device="tpu"), "device 'tpu'"),
    (lambda h, s: s["dict"].append(["deep", json.loads('{"list": [' * 120 + ']}' * 120)]), "nesting deeper"),
])
def test_inconsistent_structure_is_refused_before_reading_tensors(tmp_path, change, message):
    path = tmp_path / "ckpt.pt"
    st.save({"w": st.ones(2, 3)}, path)
    edit_header(path, change)
    with pytest.raises(CheckpointError, match=message) as info:
        st.load(path)
    assert str(path) in str(info.value)


def test_map_location_forms(tmp_path):
    path = tmp_path / "a.pt"
    st.save({"w": st.ones(2), "g": st.ones(2, requires_grad=True)}, path)
    seen = []
    for location in ("cpu", st.device("cpu"), {"cuda:0": "cpu"},
                     lambda storage, loc: seen.append(loc) or storage, lambda storage, loc: None):
        back = st.load(path, map_location=location, mmap=True)
        assert back["w"].device == st.device("cpu") and back["g"].requires_grad and back["g"].is_leaf
    assert seen == ["cpu", "cpu"]
    with pytest.raises(TypeError, match="map_location must be"):
        st.load(path, map_location=3.5)


@pytest.mark.skipif(not st.cuda.is_available(), reason="no CUDA device")
def test_map_location_cuda(tmp_path):
    path = tmp_path / "a.pt"
    torch.save({"w": torch.arange(3.0)}, path)
    for location in ("cuda", "cuda:0", st.device("cuda:0"), {"cpu": "cuda:0"}, lambda s, loc: s.cuda(0)):
        back = st.load(path, map_location=location)
        assert back["w"].device == st.device("cuda:0") and back["w"].tolist() == [0.0, 1.0, 2.0]


def test_torch_keyword_arguments(tmp_path):
    path = tmp_path / "a.pt"
    st.save({"a": 1}, path, pickle_module=pickle, pickle_protocol=4)
    assert st.load(path, pickle_module=pickle, weights_only=False, mmap=False) == {"a": 1}
    with pytest.raises(RuntimeError, match="pickle_module='json' is not supported"):
        st.load(path, pickle_module=json)
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['fix_imports'\\]"):
        st.load(path, fix_imports=True)


def test_file_objects_and_shared_tensors():
    t = st.arange(3)
    buffer = io.BytesIO()
    st.save({"a": t, "b": t}, buffer)
    buffer.seek(0)
    back = st.load(buffer)
    assert back["a"].tolist() == back["b"].tolist() == [0, 1, 2] and back["a"] is not back["b"]


# ---- the trainer's checkpoints ------------------------------------------------------------------------------------
META = {"model": "mlp", "model_config": {"hidden": [4]}, "epoch": 2, "step": 40, "best_accuracy": float("nan"),
        "history": [{"epoch": 1, "loss": 0.5}]}


def training_setup():
    model = small_model()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt, optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def test_training_state_round_trip_in_one_file(tmp_path):
    model, opt, sched = training_setup()
    train_steps(model, opt)
    sched.step()
    path = tmp_path / "checkpoint_epoch2.safetensors"
    save_training_state(path, model, opt, sched, META)
    assert os.listdir(tmp_path) == ["checkpoint_epoch2.safetensors"]
    rng_draw = st.rand(3).tolist()

    model2, opt2, sched2 = training_setup()
    meta = load_training_state(path, model2, opt2, sched2, expect_model="mlp")
    assert_same_tree(meta, META)
    assert_same_tree(read_checkpoint_meta(path), META)
    assert st.rand(3).tolist() == rng_draw           # the RNG state came back too
    assert sched2.get_last_lr() == sched.get_last_lr() == [0.05]
    train_steps(model, opt)
    train_steps(model2, opt2)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(params(model), params(model2)))


def test_read_checkpoint_meta_reads_no_tensor(tmp_path):
    model, opt, sched = training_setup()
    path = tmp_path / "ckpt.safetensors"
    save_training_state(path, model, opt, None, META)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF                                  # corrupt tensor data: only a read of the tensors sees it
    path.write_bytes(bytes(data))
    assert read_checkpoint_meta(path)["step"] == 40
    with pytest.raises(CheckpointError, match="sha256"):
        load_training_state(path, *training_setup()[:2])


def test_training_checkpoint_misuse_is_refused_before_loading(tmp_path):
    model, opt, sched = training_setup()
    path = tmp_path / "ckpt.safetensors"
    save_training_state(path, model, opt, sched, META)
    fresh, fresh_opt, _ = training_setup()
    before = params(fresh)
    with pytest.raises(CheckpointError, match="checkpoint is for model 'mlp', but the model is 'lenet5'"):
        load_training_state(path, fresh, fresh_opt, expect_model="lenet5")
    with pytest.raises(CheckpointError, match="state of a SGD optimizer, but the optimizer is a Adam"):
        load_training_state(path, fresh, optim.Adam(fresh.parameters()))
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, params(fresh)))
    with pytest.raises(CheckpointError, match="(?s)ckpt.safetensors: .*Missing key"):
        load_training_state(path, LeNet5())
    st.save({"model": model.state_dict()}, tmp_path / "plain.pt")
    with pytest.raises(CheckpointError, match="plain.pt: not a smalltrain training checkpoint"):
        read_checkpoint_meta(tmp_path / "plain.pt")
    with pytest.raises(CheckpointError, match="older two-file checkpoint format"):
        read_checkpoint_meta(tmp_path / "ckpt.json")
    with pytest.raises(TypeError, match="meta holds a Tensor"):
        save_training_state(path, model, opt, sched, {"w": st.ones(1)})
    assert read_checkpoint_meta(path)["epoch"] == 2   # the refused save left the checkpoint as it was
