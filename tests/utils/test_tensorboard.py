"""Tests for smalltrain.utils.tensorboard: files read back by tensorboard's own reader and protos, torch's layout."""
import os
import re
import struct

import numpy as np
import pytest

from smalltrain.utils.tensorboard import SummaryWriter, crc32c, masked_crc32c

event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
pywrap = pytest.importorskip("tensorboard.compat.tensorflow_stub.pywrap_tensorflow")


def read_records(path):
    """Parse a TFRecord file strictly, checking both CRCs with tensorboard's implementation."""
    with open(path, "rb") as f:
        data = f.read()
    events, pos = [], 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        assert length_crc == pywrap.masked_crc32c(header)
        payload = data[pos + 12:pos + 12 + length]
        assert len(payload) == length
        (data_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        assert data_crc == pywrap.masked_crc32c(payload)
        events.append(event_pb2.Event.FromString(payload))
        pos += 16 + length
    assert pos == len(data)
    return events


def event_files(directory):
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.startswith("events.out.tfevents."))


def accumulate(directory):
    acc = event_accumulator.EventAccumulator(str(directory))
    acc.Reload()
    return acc


def test_crc32c_known_values_and_tensorboard_agreement():
    assert crc32c(b"") == 0
    assert crc32c(b"123456789") == 0xE3069283
    rng = np.random.default_rng(0)
    for n in (1, 7, 64, 1000):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert masked_crc32c(data) == pywrap.masked_crc32c(data)


class FakeTensor:
    """Stands in for a smalltrain Tensor: exposes only .numpy()."""

    def __init__(self, array):
        self._array = np.asarray(array)

    def numpy(self):
        return self._array


class FakeScalar:
    def __init__(self, value):
        self._value = value

    def item(self):
        return self._value


def test_scalars_round_trip_through_event_accumulator(tmp_path):
    torch = pytest.importorskip("torch")
    values = [0.5, np.float32(0.25), 3, FakeTensor(np.array([1.5])), FakeScalar(-2.0), torch.tensor(7.0),
              np.array(1e-3)]
    with SummaryWriter(tmp_path) as writer:
        for step, value in enumerate(values):
            writer.add_scalar("train/loss", value, global_step=np.int64(step * 10), walltime=1000.0 + step)
    events = accumulate(tmp_path).Scalars("train/loss")
    assert [e.step for e in events] == [10 * i for i in range(len(values))]
    assert [e.wall_time for e in events] == [1000.0 + i for i in range(len(values))]
    expected = np.array([0.5, 0.25, 3, 1.5, -2.0, 7.0, 1e-3], dtype=np.float32)
    np.testing.assert_array_equal(np.array([e.value for e in events], dtype=np.float32), expected)


def test_records_decode_with_protobuf(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        writer.add_scalar("a", 1.0, global_step=-1, walltime=5.0)
        writer.add_scalar("a", 2.0)
        writer.add_histogram("h", np.arange(10.0), global_step=2 ** 40)
    (path,) = event_files(tmp_path)
    events = read_records(path)
    assert events[0].file_version == "brain.Event:2"
    assert events[1].step == -1 and events[1].wall_time == 5.0
    assert events[1].summary.value[0].tag == "a" and events[1].summary.value[0].simple_value == 1.0
    assert events[2].step == 0 and events[2].summary.value[0].simple_value == 2.0
    histo = events[3].summary.value[0].histo
    assert events[3].step == 2 ** 40
    assert (histo.min, histo.max, histo.num, histo.sum, histo.sum_squares) == (0, 9, 10, 45, 285)
    assert sum(histo.bucket) == 10


def test_histograms_match_torch(tmp_path):
    tb = pytest.importorskip("torch.utils.tensorboard")
    rng = np.random.default_rng(1)
    cases = {"normal": (rng.standard_normal(1000), "tensorflow"), "positive": (rng.random((4, 5)) + 2, "tensorflow"),
             "ints": (np.array([0, 0, 1, 5, 5, 5]), "tensorflow"), "fixed": (rng.standard_normal(300), 20),
             "auto": (rng.standard_normal(300), "auto")}
    ours, theirs = SummaryWriter(tmp_path / "ours"), tb.SummaryWriter(str(tmp_path / "torch"))
    for tag, (values, bins) in cases.items():
        ours.add_histogram(tag, values, 3, bins=bins)
        theirs.add_histogram(tag, values, 3, bins=bins)
    ours.add_histogram("max_bins", cases["normal"][0], 3, max_bins=30)
    theirs.add_histogram("max_bins", cases["normal"][0], 3, max_bins=30)
    ours.close()
    theirs.close()
    a, b = accumulate(tmp_path / "ours"), accumulate(tmp_path / "torch")
    assert sorted(a.Tags()["histograms"]) == sorted(b.Tags()["histograms"]) == sorted([*cases, "max_bins"])
    for tag in a.Tags()["histograms"]:
        (ha,), (hb,) = a.Histograms(tag), b.Histograms(tag)
        assert ha.step == hb.step == 3
        va, vb = ha.histogram_value, hb.histogram_value
        assert (va.min, va.max, va.num) == (vb.min, vb.max, vb.num)
        np.testing.assert_allclose([va.sum, va.sum_squares], [vb.sum, vb.sum_squares], rtol=1e-12)
        assert list(va.bucket_limit) == list(vb.bucket_limit)
        assert list(va.bucket) == list(vb.bucket)


def test_add_scalars_layout_matches_torch(tmp_path):
    tb = pytest.importorskip("torch.utils.tensorboard")
    ours, theirs = SummaryWriter(tmp_path / "ours"), tb.SummaryWriter(str(tmp_path / "torch"))
    for step in range(3):
        for writer in (ours, theirs):
            writer.add_scalars("loss/all", {"train": 1.0 / (step + 1), "test": 2.0 * step}, step, walltime=10.0 + step)
            writer.add_scalar("lr", 0.1, step)
    ours.close()
    theirs.close()

    def layout(root):
        runs = {}
        for directory, _, files in os.walk(root):
            if any(f.startswith("events.out.tfevents.") for f in files):
                acc = accumulate(directory)
                runs[os.path.relpath(directory, root)] = {
                    tag: [(e.step, e.wall_time if tag != "lr" else None, e.value) for e in acc.Scalars(tag)]
                    for tag in acc.Tags()["scalars"]}
        return runs

    ours_layout, torch_layout = layout(tmp_path / "ours"), layout(tmp_path / "torch")
    assert sorted(ours_layout) == [".", "loss_all_test", "loss_all_train"]
    assert ours_layout == torch_layout


def test_file_name_and_default_log_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    writer = SummaryWriter(comment="_lr0.1", filename_suffix=".v2")
    writer.close()
    host = re.escape(__import__("socket").gethostname())
    assert re.fullmatch(r"runs/[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_" + host + r"_lr0\.1", writer.log_dir)
    (path,) = event_files(writer.log_dir)
    pattern = r"events\.out\.tfevents\.\d{10}\." + host + rf"\.{os.getpid()}\.\d{{6}}\.v2"
    assert re.fullmatch(pattern, os.path.basename(path))
    assert not [n for n in os.listdir(writer.log_dir) if n.endswith(".tmp")]


def test_buffering_flush_and_close(tmp_path):
    writer = SummaryWriter(tmp_path, max_queue=3)
    (path,) = event_files(tmp_path)
    assert len(read_records(path)) == 1  # the file_version record is on disk at once
    for step in range(3):
        writer.add_scalar("x", step, step)
    assert len(read_records(path)) == 1  # still buffered: queue not exceeded
    writer.add_scalar("x", 3, 3)
    assert len(read_records(path)) == 5  # exceeding max_queue writes them all
    writer.add_scalar("x", 4, 4)
    writer.flush()
    assert len(read_records(path)) == 6
    writer.add_scalar("x", 5, 5)
    writer.close()
    writer.close()  # a second close is harmless
    assert [e.step for e in accumulate(tmp_path).Scalars("x")] == list(range(6))


def test_flush_secs_flushes_on_next_event(tmp_path):
    writer = SummaryWriter(tmp_path, flush_secs=0)
    (path,) = event_files(tmp_path)
    writer.add_scalar("x", 1.0, 0)
    assert len(read_records(path)) == 2
    writer.close()


def test_write_after_close_opens_new_file(tmp_path):
    writer = SummaryWriter(tmp_path)
    writer.add_scalar("x", 1.0, 0)
    writer.close()
    writer.add_scalar("x", 2.0, 1)
    writer.close()
    assert len(event_files(tmp_path)) == 2
    assert [e.value for e in accumulate(tmp_path).Scalars("x")] == [1.0, 2.0]


def test_purge_step_hides_stale_events(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        for step in range(10):
            writer.add_scalar("x", float(step), step)
    with SummaryWriter(tmp_path, purge_step=5) as writer:
        for step in range(5, 8):
            writer.add_scalar("x", 100.0 + step, step)
    events = accumulate(tmp_path).Scalars("x")
    assert [e.step for e in events] == list(range(8))
    assert [e.value for e in events][4:] == [4.0, 105.0, 106.0, 107.0]


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda w: w.add_scalar("x", np.ones(3)), "expected a single value for tag 'x'"),
        (lambda w: w.add_scalar(3, 1.0), "tag must be a str"),
        (lambda w: w.add_histogram("h", np.array([])), "no elements"),
        (lambda w: w.add_histogram("h", np.array([1.0, np.nan])), "NaN or inf"),
    ],
)
def test_bad_input_raises(tmp_path, call, error):
    with SummaryWriter(tmp_path) as writer, pytest.raises((ValueError, TypeError), match=re.escape(error)):
        call(writer)


# ---- images, text, hparams: read back with EventAccumulator, beside torch's SummaryWriter for the same calls ----

def _both_writers(tmp_path, calls):
    """Run calls(writer) with ours and torch's SummaryWriter; the accumulators of both log dirs."""
    from torch.utils.tensorboard import SummaryWriter as TorchWriter
    with SummaryWriter(tmp_path / "ours") as w:
        calls(w)
    with TorchWriter(str(tmp_path / "torch")) as w:
        calls(w)
    return accumulate(tmp_path / "ours"), accumulate(tmp_path / "torch")


def _decode_png(data):
    import io

    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(data)))


def test_add_image_round_trip_like_torch(tmp_path):
    rng = np.random.default_rng(0)
    chw = rng.uniform(0, 1, (3, 5, 7)).astype(np.float32)
    hwc = rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)
    gray = rng.uniform(-0.5, 1.5, (1, 3, 4)).astype(np.float32)   # out of [0, 1]: clipped, as torch's
    hw = rng.integers(0, 256, (2, 3), dtype=np.uint8)
    rgba = rng.uniform(0, 1, (4, 3, 2)).astype(np.float64)

    def calls(w):
        w.add_image("chw", chw, 1)
        w.add_image("hwc", hwc, 2, dataformats="HWC")
        w.add_image("gray", gray, 3)
        w.add_image("hw", hw, 4, dataformats="HW")
        w.add_image("rgba", rgba, 5)
    ours, theirs = _both_writers(tmp_path, calls)
    for tag in ("chw", "hwc", "gray", "hw", "rgba"):
        (a,), (b,) = ours.Images(tag), theirs.Images(tag)
        assert (a.step, a.width, a.height) == (b.step, b.width, b.height)
        np.testing.assert_array_equal(_decode_png(a.encoded_image_string), _decode_png(b.encoded_image_string))
    np.testing.assert_array_equal(_decode_png(ours.Images("hwc")[0].encoded_image_string), hwc)


def test_add_text_round_trip_like_torch(tmp_path):
    def calls(w):
        w.add_text("notes", "lr **1e-3**, ünïcode", 7)
    ours, theirs = _both_writers(tmp_path, calls)
    (a,), (b,) = ours.Tensors("notes/text_summary"), theirs.Tensors("notes/text_summary")
    assert a.step == b.step == 7
    assert a.tensor_proto == b.tensor_proto
    assert ours.PluginTagToContent("text") == theirs.PluginTagToContent("text")


def test_add_hparams_like_torch(tmp_path):
    from tensorboard.plugins.hparams import plugin_data_pb2

    def calls(w):
        w.add_hparams({"lr": 0.01, "bsize": 64, "opt": "adam", "nesterov": True}, {"hparam/accuracy": 0.91},
                      hparam_domain_discrete={"opt": ["adam", "sgd"], "bsize": [32, 64]}, run_name="run0")
    calls_dirs = _both_writers(tmp_path, calls)
    del calls_dirs
    ours, theirs = accumulate(tmp_path / "ours" / "run0"), accumulate(tmp_path / "torch" / "run0")
    a, b = ours.PluginTagToContent("hparams"), theirs.PluginTagToContent("hparams")
    assert sorted(a) == sorted(b) == ["_hparams_/experiment", "_hparams_/session_end_info",
                                      "_hparams_/session_start_info"]
    for tag in a:
        pa, pb = plugin_data_pb2.HParamsPluginData(), plugin_data_pb2.HParamsPluginData()
        pa.ParseFromString(a[tag])
        pb.ParseFromString(b[tag])
        assert pa == pb, tag
    assert [e.value for e in ours.Scalars("hparam/accuracy")] == pytest.approx([0.91])


@pytest.mark.parametrize("call, error", [
    (lambda w: w.add_image("x", np.zeros((2, 3, 4)), dataformats="HW"), ValueError),
    (lambda w: w.add_image("x", np.zeros((2, 3, 4)), dataformats="CHX"), ValueError),
    (lambda w: w.add_text("x", 3), TypeError),
    (lambda w: w.add_hparams([1], {}), TypeError),
    (lambda w: w.add_hparams({"a": [1]}, {}), ValueError),
])
def test_image_text_hparams_bad_input(tmp_path, call, error):
    with SummaryWriter(tmp_path) as w, pytest.raises(error):
        call(w)
