#!/usr/bin/env python3
"""ckpt_edit.py - rewrite one text chunk of a checkpoint, checksums and all,
to make the damaged-but-well-formed files the readers must refuse.

    ckpt_edit.py IN OUT PART OLD NEW

PART is config (chunk 0), meta (chunk 1) or index (the last chunk); OLD
must occur in it and is replaced by NEW (every occurrence; \\n is a newline).
The container layout is man/asyncpp-formats.5's CONTAINER; the new chunk is
compressed by the zstd command (which writes the content size and checksum).
"""
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tb_events import crc32c  # noqa: E402 (the one CRC32C of the test scripts)


def compress(data):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
    try:
        return subprocess.run(["zstd", "-q", "-1", "-c", f.name], check=True,
                              stdout=subprocess.PIPE).stdout
    finally:
        os.unlink(f.name)


def main():
    src, dst, part, old, new = sys.argv[1:6]
    old, new = old.replace("\\n", "\n"), new.replace("\\n", "\n")
    raw = open(src, "rb").read()
    assert raw[-8:] == b"ASPCSEEK", "not a container"
    n = struct.unpack_from("<Q", raw, len(raw) - 20)[0]
    table = len(raw) - (28 + 24 * n)
    hsize = 8 + struct.unpack_from("<I", raw, 4)[0]
    entries = [list(struct.unpack_from("<QQII", raw, table + 8 + 24 * i)) for i in range(n)]
    frames, off = [], hsize
    for e in entries:
        frames.append(raw[off:off + e[0]])
        off += e[0]
    i = {"config": 0, "meta": 1, "index": n - 1}[part]
    text = subprocess.run(["zstd", "-q", "-dc"], input=frames[i], check=True,
                          stdout=subprocess.PIPE).stdout.decode()
    if old not in text:
        sys.exit("ckpt_edit.py: %r is not in the %s chunk:\n%s" % (old, part, text))
    data = text.replace(old, new).encode()
    frames[i] = compress(data)
    entries[i] = [len(frames[i]), len(data), crc32c(frames[i]), crc32c(data)]
    body = b"".join(struct.pack("<QQII", *e) for e in entries) + struct.pack("<Q", n)
    seek = (struct.pack("<II", 0x184D2A5B, 24 * n + 20) + body + struct.pack("<I", crc32c(body))
            + b"ASPCSEEK")
    with open(dst, "wb") as f:
        f.write(raw[:hsize] + b"".join(frames) + seek)


if __name__ == "__main__":
    main()
