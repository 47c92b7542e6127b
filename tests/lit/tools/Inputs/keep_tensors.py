#!/usr/bin/env python3
"""keep_tensors.py SRC DST NAME...: copies safetensors file SRC to DST with only tensors NAME..."""
import json
import struct
import sys

src, dst, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(src, "rb") as f:
    blob = f.read()
n = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + n])
data = blob[8 + n:]
kept, out = {}, b""
for name in names:
    info = dict(header[name])
    begin, end = info["data_offsets"]
    info["data_offsets"] = [len(out), len(out) + end - begin]
    out += data[begin:end]
    kept[name] = info
text = json.dumps(kept).encode()
text += b" " * (-len(text) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + out)
