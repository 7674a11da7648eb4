"""What a text file that is not UTF-8 holds, and the ``iconv`` command that converts it."""

from __future__ import annotations

from pathlib import Path

_BOMS = (  # longest first: the UTF-32 LE mark begins with the UTF-16 LE one
    (b"\xff\xfe\x00\x00", "UTF-32", "UTF-32 (little-endian, with a byte-order mark)"),
    (b"\x00\x00\xfe\xff", "UTF-32", "UTF-32 (big-endian, with a byte-order mark)"),
    (b"\xff\xfe", "UTF-16", "UTF-16 (little-endian, with a byte-order mark)"),
    (b"\xfe\xff", "UTF-16", "UTF-16 (big-endian, with a byte-order mark)"),
)


def detect_wide_encoding(head: bytes) -> tuple[str, str] | None:
    """(iconv name, description) when ``head``, a file's first bytes, is UTF-16 or UTF-32 text: by its byte-order
    mark, or, without one, by NUL bytes in every other byte (ASCII-range text in UTF-16); None otherwise."""
    for mark, name, description in _BOMS:
        if head.startswith(mark):
            return name, description
    sample = head[: len(head) - len(head) % 2]
    if len(sample) < 4:
        return None
    even, odd = sample[0::2], sample[1::2]
    # Latin text in UTF-16 has a NUL as the high byte of most characters; UTF-8 and 8-bit text have almost none.
    if odd.count(0) >= 0.4 * len(odd) and even.count(0) <= 0.05 * len(even):
        return "UTF-16LE", "UTF-16 (little-endian, no byte-order mark)"
    if even.count(0) >= 0.4 * len(even) and odd.count(0) <= 0.05 * len(odd):
        return "UTF-16BE", "UTF-16 (big-endian, no byte-order mark)"
    return None


def conversion_advice(path: Path, error: UnicodeDecodeError | None = None) -> str:
    """Why ``path`` is not UTF-8 and the command that converts it: ``is UTF-16 …; convert it: `iconv …```.

    A UTF-16 or UTF-32 file is named as such, with its own ``iconv -f``; any other file gets the position of the
    first invalid byte and the Latin-1 conversion, the usual case of an 8-bit file.
    """
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
    except OSError:
        head = b""
    converted = f"{path.stem}.utf8{path.suffix}"
    wide = detect_wide_encoding(head)
    if wide is not None:
        name, description = wide
        return f"is {description} text, not UTF-8; convert it: `iconv -f {name} -t UTF-8 {path.name} > {converted}`"
    where = "" if error is None else f" (byte {error.start}: {error.reason})"
    return f"is not UTF-8 text{where}; convert it, e.g. `iconv -f latin1 -t utf-8 {path.name}`"
