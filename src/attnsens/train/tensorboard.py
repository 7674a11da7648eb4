"""TensorBoard event files of scalars, written without TensorBoard installed.

An event file is a sequence of TFRecord records (a little-endian uint64 length, the masked CRC-32C of those 8
bytes, the payload, the masked CRC-32C of the payload), each payload one serialized ``tensorboard.Event``
protocol buffer: first ``Event{wall_time, file_version: "brain.Event:2"}``, then one
``Event{wall_time, step, summary: Summary{value: [Value{tag, simple_value}]}}`` per scalar. This is the format
``torch.utils.tensorboard.SummaryWriter.add_scalar`` writes, and TensorBoard (``tensorboard --logdir DIR``) reads.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path
from types import TracebackType
from typing import Any


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, as TFRecord framing uses it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # int64 fields encode negatives as ten-byte two's complement
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(
    wall_time: float, step: int | None = None, *, file_version: str | None = None, summary: bytes = b""
) -> bytes:
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time)  # double wall_time = 1
    if step is not None:
        out += _varint(2 << 3) + _varint(step)  # int64 step = 2
    if file_version is not None:
        out += _field_bytes(3, file_version.encode())  # string file_version = 3
    if summary:
        out += _field_bytes(5, summary)  # Summary summary = 5
    return out


def _scalar_summary(tag: str, value: float) -> bytes:
    # Summary{repeated Value value = 1}; Value{string tag = 1; float simple_value = 2}
    entry = _field_bytes(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value)
    return _field_bytes(1, entry)


def _record(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", masked_crc32c(length)) + payload + struct.pack("<I", masked_crc32c(payload))


class ScalarEventWriter:
    """Appends scalars to a new event file in ``log_dir`` (``events.out.tfevents.<time>.<host>.<pid>.attnsens``).

    ``add_scalar(tag, value, step)`` as in ``SummaryWriter``; records are flushed every ``flush_every`` scalars and
    on ``flush``/``close`` (also a context manager).
    """

    def __init__(self, log_dir: str | Path, *, flush_every: int = 64) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        name = f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.attnsens"
        self.path = self.log_dir / name
        self._file: Any = open(self.path, "ab")  # closed by close()
        self._pending = 0
        self.flush_every = flush_every
        self._file.write(_record(_event(now, file_version="brain.Event:2")))
        self.flush()

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        event = _event(time.time() if wall_time is None else wall_time, step, summary=_scalar_summary(tag, value))
        self._file.write(_record(event))
        self._pending += 1
        if self._pending >= self.flush_every:
            self.flush()

    def add_scalars(self, values: dict[str, float], step: int, wall_time: float | None = None) -> None:
        """One scalar per tag of ``values``, all at ``step``."""
        for tag, value in values.items():
            self.add_scalar(tag, value, step, wall_time)

    def flush(self) -> None:
        self._file.flush()
        self._pending = 0

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> ScalarEventWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
