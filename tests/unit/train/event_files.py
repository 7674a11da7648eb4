"""An independent reader of TensorBoard event files for tests: TFRecord framing with both CRCs checked (a bitwise
CRC-32C), and each payload decoded as tensorboard's Event message by protobuf, from the field numbers of
tensorboard's event.proto and summary.proto."""

from __future__ import annotations

import struct
from pathlib import Path


def _crc32c_bitwise(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 * (crc & 1))
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    crc = _crc32c_bitwise(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path: Path) -> list[bytes]:
    """The payloads of a TFRecord file; asserts every length and payload CRC."""
    data = path.read_bytes()
    payloads, offset = [], 0
    while offset < len(data):
        header = data[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
        assert header_crc == _masked(header), f"bad length CRC at byte {offset}"
        payload = data[offset + 12 : offset + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[offset + 12 + length : offset + 16 + length])
        assert payload_crc == _masked(payload), f"bad payload CRC at byte {offset}"
        payloads.append(payload)
        offset += 16 + length
    assert offset == len(data)
    return payloads


def _event_class():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="attnsens_test_event.proto", package="attnsens_test")

    def message(name: str, fields: list[tuple[str, int, int, int, str]]) -> None:
        added = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            field = added.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = type_name

    optional, repeated = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("Value", [("tag", 1, F.TYPE_STRING, optional, ""), ("simple_value", 2, F.TYPE_FLOAT, optional, "")])
    message("Summary", [("value", 1, F.TYPE_MESSAGE, repeated, ".attnsens_test.Value")])
    message(
        "Event",
        [
            ("wall_time", 1, F.TYPE_DOUBLE, optional, ""),
            ("step", 2, F.TYPE_INT64, optional, ""),
            ("file_version", 3, F.TYPE_STRING, optional, ""),
            ("summary", 5, F.TYPE_MESSAGE, optional, ".attnsens_test.Summary"),
        ],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("attnsens_test.Event"))


def read_scalars(log_dir: Path) -> tuple[list[str], dict[str, list[tuple[int, float]]]]:
    """(file_version of each event file, {tag: [(step, value), …]}) over every event file in ``log_dir``."""
    event_class = _event_class()
    versions: list[str] = []
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        events = [event_class.FromString(payload) for payload in read_records(path)]
        versions.append(events[0].file_version)
        for event in events[1:]:
            assert event.wall_time > 0
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return versions, scalars
