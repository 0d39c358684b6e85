"""Utilities: data loading (`utils.data`), TensorBoard logging, checkpoints and file helpers."""
