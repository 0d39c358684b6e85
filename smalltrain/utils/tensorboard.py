"""TensorBoard `SummaryWriter` (torch's API: scalars, histograms, images, text, hparams) that writes real event files
with no TensorFlow/tensorboard/protobuf.

Records are TFRecord-framed (length, masked CRC32C, payload, masked CRC32C); payloads are hand-encoded Event protos.
"""
import functools
import itertools
import os
import socket
import struct
import time
import weakref
from datetime import datetime

import numpy as np

from smalltrain.utils.io import atomic_write

__all__ = ["SummaryWriter", "crc32c", "masked_crc32c"]

# ---------------------------------------------------------------------------------------------------------------
# CRC32C (Castagnoli), the checksum TFRecord uses. Table-driven: one lookup per byte.


def _crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data):
    """CRC32C of `data` (bytes-like); crc32c(b"123456789") == 0xE3069283."""
    table = _CRC32C_TABLE
    crc = 0xFFFFFFFF
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    """The masked CRC TFRecord stores, so that a CRC of data containing CRCs stays well distributed."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _tfrecord(payload):
    header = struct.pack("<Q", len(payload))
    return header + struct.pack("<I", masked_crc32c(header)) + payload + struct.pack("<I", masked_crc32c(payload))


# ---------------------------------------------------------------------------------------------------------------
# Protobuf wire format, just the field kinds the Event/Summary/HistogramProto messages need.


def _varint(value):
    value &= (1 << 64) - 1  # negative int64 is encoded as its 64-bit two's complement (10 bytes)
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _key(field, wire_type):
    return _varint(field << 3 | wire_type)


def _pb_double(field, value):
    return _key(field, 1) + struct.pack("<d", value)


def _pb_float(field, value):
    with np.errstate(over="ignore"):  # out-of-range doubles become +-inf, as a protobuf float field would
        return _key(field, 5) + np.array(value, dtype="<f4").tobytes()


def _pb_int64(field, value):
    return _key(field, 0) + _varint(value)


def _pb_bytes(field, payload):
    return _key(field, 2) + _varint(len(payload)) + payload


def _pb_string(field, text):
    return _pb_bytes(field, text.encode("utf-8"))


def _pb_packed_doubles(field, values):
    return _pb_bytes(field, np.ascontiguousarray(values, dtype="<f8").tobytes())


def _event(wall_time, step=None, file_version=None, summary=None, session_log_status=None, writer=None):
    """Serialize an Event; fields are emitted in field-number order, as protobuf does."""
    out = _pb_double(1, wall_time)
    if step is not None:
        out += _pb_int64(2, step)
    if file_version is not None:
        out += _pb_string(3, file_version)
    if summary is not None:
        out += _pb_bytes(5, summary)
    if session_log_status is not None:
        out += _pb_bytes(7, _pb_int64(1, session_log_status))
    if writer is not None:
        out += _pb_bytes(10, _pb_string(1, writer))
    return out


def _summary_scalar(tag, value):
    return _pb_bytes(1, _pb_string(1, tag) + _pb_float(2, value))


def _summary_histogram(tag, hist):
    vmin, vmax, num, total, sum_squares, limits, counts = hist
    histo = (_pb_double(1, vmin) + _pb_double(2, vmax) + _pb_double(3, num) + _pb_double(4, total)
             + _pb_double(5, sum_squares) + _pb_packed_doubles(6, limits) + _pb_packed_doubles(7, counts))
    return _pb_bytes(1, _pb_string(1, tag) + _pb_bytes(5, histo))


def _pb_message(field, payload):
    return _pb_bytes(field, payload)


def _summary_value(tag, metadata=b"", image=b"", tensor=b""):
    """A Summary with one Value: tag (1), image (4), tensor (8), metadata (9), in field order."""
    value = _pb_string(1, tag)
    if image:
        value += _pb_message(4, image)
    if tensor:
        value += _pb_message(8, tensor)
    if metadata:
        value += _pb_message(9, metadata)
    return _pb_bytes(1, value)


def _plugin_metadata(plugin_name, content=b""):
    """SummaryMetadata{plugin_data: PluginData{plugin_name, content}}."""
    plugin = _pb_string(1, plugin_name) + (_pb_bytes(2, content) if content else b"")
    return _pb_message(1, plugin)


def _png(hwc):
    """An 8-bit RGB or RGBA PNG of a uint8 [H, W, 3 or 4] array (rows unfiltered, zlib-deflated)."""
    import zlib
    h, w, c = hwc.shape

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    header = struct.pack(">IIBBBBB", w, h, 8, 2 if c == 3 else 6, 0, 0, 0)
    rows = np.concatenate([np.zeros((h, 1), np.uint8), np.ascontiguousarray(hwc).reshape(h, w * c)], axis=1)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
            + chunk(b"IEND", b""))


def _image_hwc(tag, img, dataformats):
    """torch's add_image conversion: to HWC, gray tiled to RGB, float scaled by 255 (uint8 kept), clipped."""
    array = _as_numpy(img)
    fmt = dataformats.upper()
    if sorted(fmt) not in (sorted("CHW"), sorted("HW")) or len(set(fmt)) != len(fmt):
        raise ValueError(f"add_image: dataformats must be a permutation of 'CHW', 'HWC' or 'HW', got {dataformats!r}")
    if array.ndim != len(fmt):
        raise ValueError(f"add_image: tag {tag!r}: an image of shape {list(array.shape)} does not match "
                         f"dataformats {dataformats!r}")
    scale = 1 if array.dtype == np.uint8 else 255
    if len(fmt) == 2:
        hwc = np.stack([array.transpose([fmt.find(c) for c in "HW"])] * 3, axis=2)
    else:
        hwc = array.transpose([fmt.find(c) for c in "HWC"])
        if hwc.shape[2] == 1:
            hwc = np.concatenate([hwc] * 3, axis=2)
    if hwc.shape[2] not in (3, 4):
        raise ValueError(f"add_image: tag {tag!r}: expected 1, 3 or 4 channels, got {hwc.shape[2]}")
    return (hwc.astype(np.float32) * scale).clip(0, 255).astype(np.uint8)


def _summary_image(tag, hwc):
    h, w, c = hwc.shape
    image = _pb_int64(1, h) + _pb_int64(2, w) + _pb_int64(3, c) + _pb_bytes(4, _png(hwc))
    return _summary_value(tag, image=image)


def _summary_text(tag, text):
    # TensorProto{dtype: DT_STRING (7), tensor_shape: [1], string_val: [text]}; TextPluginData(version=0) is empty
    tensor = _pb_int64(1, 7) + _pb_message(2, _pb_message(2, _pb_int64(1, 1))) + _pb_string(8, text)
    return _summary_value(tag + "/text_summary", metadata=_plugin_metadata("text"), tensor=tensor)


def _pb_value(v):
    """google.protobuf.Value: number_value (2), string_value (3) or bool_value (4)."""
    if isinstance(v, bool):
        return _pb_int64(4, int(v))
    if isinstance(v, str):
        return _pb_string(3, v)
    return _pb_double(2, float(v))


def _hparams_summaries(hparam_dict, metric_dict, domain_discrete):
    """torch's summary.hparams: the experiment, session-start and session-end summaries (the hparams plugin)."""
    infos, start = b"", b""
    for k, v in hparam_dict.items():
        if v is None:
            continue
        if not isinstance(v, (int, float, str, bool)):
            if callable(getattr(v, "item", None)):
                v = float(_as_numpy(v).reshape(-1)[0])
            else:
                raise ValueError("value should be one of int, float, str, bool, or torch.Tensor")
        # torch tests int before bool, so a bool is reported as a FLOAT64 hparam holding its number
        kind = 1 if isinstance(v, str) else 3
        v = v if isinstance(v, str) else float(v)
        info = _pb_string(1, k) + _pb_int64(4, kind)
        if k in domain_discrete:
            info += _pb_message(5, b"".join(_pb_message(1, _pb_value(d if isinstance(d, str) else float(d)))
                                            for d in domain_discrete[k]))
        infos += _pb_message(4, info)
        start += _pb_message(1, _pb_string(1, k) + _pb_message(2, _pb_value(v)))
    metrics = b"".join(_pb_message(5, _pb_message(1, _pb_string(2, k))) for k in metric_dict)

    def summary(tag, field, payload):
        content = _pb_message(field, payload)   # HParamsPluginData{version: 0, <field>: payload}
        return _summary_value(tag, metadata=_plugin_metadata("hparams", content))
    return (summary("_hparams_/experiment", 2, infos + metrics),
            summary("_hparams_/session_start_info", 3, start),
            summary("_hparams_/session_end_info", 4, _pb_int64(1, 1)))   # status: STATUS_SUCCESS


# ---------------------------------------------------------------------------------------------------------------
# Values: numpy arrays, Python numbers, smalltrain/torch tensors (anything with .numpy() or .item()).


def _as_numpy(value):
    if isinstance(value, (np.ndarray, np.generic, int, float, bool)):
        return np.asarray(value)
    if callable(getattr(value, "detach", None)):
        value = value.detach()
    if type(value).__module__.split(".")[0] == "cupy":
        return value.get()
    if callable(getattr(value, "cpu", None)):
        value = value.cpu()
    if callable(getattr(value, "numpy", None)):
        return np.asarray(value.numpy())
    if callable(getattr(value, "item", None)):
        return np.asarray(value.item())
    return np.asarray(value)


def _as_float(value, op, tag):
    array = _as_numpy(value)
    if array.size != 1:
        raise ValueError(f"{op}: expected a single value for tag {tag!r}, got an array of shape {list(array.shape)}")
    return float(array.reshape(()))


def _as_step(step):
    if step is None:
        return None
    return int(step.item() if callable(getattr(step, "item", None)) else step)


def _check_tag(op, tag):
    if not isinstance(tag, str):
        raise TypeError(f"{op}: tag must be a str, got {type(tag).__name__}")


@functools.lru_cache(maxsize=1)
def _tensorflow_bins():
    """torch's default histogram edges: +-1e-12 growing by 1.1x up to 1e20, and 0 (same Python float loop)."""
    v, buckets = 1e-12, []
    while v < 1e20:
        buckets.append(v)
        v *= 1.1
    return np.array([-b for b in reversed(buckets)] + [0.0] + buckets)


def _histogram(tag, values, bins, max_bins):
    """Histogram summary fields, computed as torch.utils.tensorboard.summary.make_histogram does."""
    values = _as_numpy(values).astype(np.float64).reshape(-1)
    if values.size == 0:
        raise ValueError(f"add_histogram: values for tag {tag!r} have no elements")
    if not np.isfinite(values).all():
        raise ValueError(f"add_histogram: values for tag {tag!r} contain NaN or inf")
    counts, limits = np.histogram(values, bins=_tensorflow_bins() if isinstance(bins, str) and bins == "tensorflow"
                                  else bins)
    if max_bins is not None and len(counts) > max_bins:
        group = len(counts) // max_bins
        counts = np.pad(counts, (0, (-len(counts)) % group)).reshape(-1, group).sum(axis=-1)
        limits = np.concatenate([limits[:-1:group], limits[-1:]])
    if counts.sum() == 0:
        raise ValueError(f"add_histogram: no value for tag {tag!r} falls inside the bins")
    # Keep the support only. TensorBoard stores right edges, so one empty bin on the left carries the left edge.
    nonzero = np.flatnonzero(counts)
    start, end = int(nonzero[0]), int(nonzero[-1]) + 1
    counts = counts[start - 1:end] if start > 0 else np.concatenate([[0], counts[:end]])
    limits = limits[start:end + 1]
    return (values.min(), values.max(), float(values.size), values.sum(), values.dot(values), limits,
            counts.astype(np.float64))


# ---------------------------------------------------------------------------------------------------------------
# Event files and the writer.

_file_counter = itertools.count()


def _append_records(path, pending):
    """Append whole records and fsync, so a crash loses at most the unflushed tail, never part of a record."""
    if not pending:
        return
    data = b"".join(pending)
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    pending.clear()


class _EventFileWriter:
    """One event file: created atomically with its file_version record, then appended to on flush."""

    def __init__(self, log_dir, max_queue, flush_secs, filename_suffix):
        os.makedirs(log_dir, exist_ok=True)
        # torch's name, except that the counter is zero-padded: readers load files in name order, and with torch's
        # unpadded counter a file ".10" opened in the same second as ".9" would be read (and purged) out of order.
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
                f".{next(_file_counter):06d}")
        self.log_dir = log_dir
        self.path = os.path.join(log_dir, name + filename_suffix)
        self.max_queue = max_queue
        self.flush_secs = flush_secs
        first = _event(time.time(), file_version="brain.Event:2", writer="smalltrain.utils.tensorboard")
        with atomic_write(self.path) as f:
            f.write(_tfrecord(first))
        self._pending = []
        self._last_flush = time.monotonic()
        # Events still buffered when the writer is garbage-collected or the interpreter exits are not lost.
        self._finalizer = weakref.finalize(self, _append_records, self.path, self._pending)

    def add_event(self, payload):
        self._pending.append(_tfrecord(payload))
        if len(self._pending) > self.max_queue or time.monotonic() - self._last_flush >= self.flush_secs:
            self.flush()

    def flush(self):
        _append_records(self.path, self._pending)
        self._last_flush = time.monotonic()

    def close(self):
        self.flush()
        self._finalizer.detach()


class SummaryWriter:
    """Writes scalars, histograms, images, text and hparams to TensorBoard event files under `log_dir`, like
    torch's SummaryWriter.

    Events are buffered in memory and appended to the file by `flush()`, `close()`, when more than `max_queue`
    are pending, or on the first event added `flush_secs` after the last flush (there is no background thread).
    """

    def __init__(self, log_dir=None, comment="", purge_step=None, max_queue=10, flush_secs=120, filename_suffix=""):
        if not log_dir:
            now = datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", now + "_" + socket.gethostname() + comment)
        self.log_dir = os.fspath(log_dir)
        self.purge_step = purge_step
        self.max_queue = max_queue
        self.flush_secs = flush_secs
        self.filename_suffix = filename_suffix
        self._writers = None
        self._file_writer()

    def _file_writer(self):
        """The main file writer; after close() the next event opens a new file, as torch does."""
        if self._writers is None:
            writer = _EventFileWriter(self.log_dir, self.max_queue, self.flush_secs, self.filename_suffix)
            self._writers = {self.log_dir: writer}
            if self.purge_step is not None:
                # A START session log at step s makes TensorBoard drop earlier-written events with step >= s.
                step, now = int(self.purge_step), time.time()
                writer.add_event(_event(now, step=step, file_version="brain.Event:2"))
                writer.add_event(_event(now, step=step, session_log_status=1))
                self.purge_step = None
        return self._writers[self.log_dir]

    def get_logdir(self):
        return self.log_dir

    def add_scalar(self, tag, scalar_value, global_step=None, walltime=None):
        _check_tag("add_scalar", tag)
        summary = _summary_scalar(tag, _as_float(scalar_value, "add_scalar", tag))
        wall_time = time.time() if walltime is None else float(walltime)
        self._file_writer().add_event(_event(wall_time, step=_as_step(global_step), summary=summary))

    def add_scalars(self, main_tag, tag_scalar_dict, global_step=None, walltime=None):
        """Each entry goes, under tag `main_tag`, to its own run `log_dir/<main_tag with / as _>_<tag>`."""
        _check_tag("add_scalars", main_tag)
        wall_time = time.time() if walltime is None else float(walltime)
        step = _as_step(global_step)
        base = self._file_writer().log_dir
        for tag, value in tag_scalar_dict.items():
            summary = _summary_scalar(main_tag, _as_float(value, "add_scalars", f"{main_tag}/{tag}"))
            run_dir = base + "/" + main_tag.replace("/", "_") + "_" + tag
            writer = self._writers.get(run_dir)
            if writer is None:
                writer = _EventFileWriter(run_dir, self.max_queue, self.flush_secs, self.filename_suffix)
                self._writers[run_dir] = writer
            writer.add_event(_event(wall_time, step=step, summary=summary))

    def add_histogram(self, tag, values, global_step=None, bins="tensorflow", walltime=None, max_bins=None):
        """`bins` is 'tensorflow' (torch's default exponential edges) or anything `np.histogram` accepts."""
        _check_tag("add_histogram", tag)
        summary = _summary_histogram(tag, _histogram(tag, values, bins, max_bins))
        wall_time = time.time() if walltime is None else float(walltime)
        self._file_writer().add_event(_event(wall_time, step=_as_step(global_step), summary=summary))

    def _add_summary(self, summary, global_step, walltime):
        wall_time = time.time() if walltime is None else float(walltime)
        self._file_writer().add_event(_event(wall_time, step=_as_step(global_step), summary=summary))

    def add_image(self, tag, img_tensor, global_step=None, walltime=None, dataformats="CHW"):
        """One image (uint8 0..255, or float in [0, 1]), stored as a PNG; dataformats 'CHW', 'HWC', 'HW'..."""
        _check_tag("add_image", tag)
        self._add_summary(_summary_image(tag, _image_hwc(tag, img_tensor, dataformats)), global_step, walltime)

    def add_text(self, tag, text_string, global_step=None, walltime=None):
        _check_tag("add_text", tag)
        if not isinstance(text_string, str):
            raise TypeError(f"add_text: text_string must be a str, got {type(text_string).__name__}")
        self._add_summary(_summary_text(tag, text_string), global_step, walltime)

    def add_hparams(self, hparam_dict, metric_dict, hparam_domain_discrete=None, run_name=None, global_step=None):
        """Hyperparameters and their metrics for TensorBoard's HPARAMS tab, in a run `log_dir/run_name`."""
        if not isinstance(hparam_dict, dict) or not isinstance(metric_dict, dict):
            raise TypeError("hparam_dict and metric_dict should be dictionary.")
        domain = hparam_domain_discrete or {}
        summaries = _hparams_summaries(hparam_dict, metric_dict, domain)
        run_dir = os.path.join(self._file_writer().log_dir, run_name or str(time.time()))
        with SummaryWriter(log_dir=run_dir) as w_hp:
            for summary in summaries:
                w_hp._add_summary(summary, global_step, None)
            for k, v in metric_dict.items():
                w_hp.add_scalar(k, v, global_step)

    def flush(self):
        for writer in (self._writers or {}).values():
            writer.flush()

    def close(self):
        for writer in (self._writers or {}).values():
            writer.close()
        self._writers = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self.close()
