#!/usr/bin/env python3
"""Copies a safetensors checkpoint directory without one tensor: drop_tensor.py SRC DST NAME."""
import json
import os
import struct
import sys

src, dst, name = sys.argv[1:4]
with open(os.path.join(src, "model.safetensors"), "rb") as f:
    blob = f.read()
n = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + n])
data = blob[8 + n:]
del header[name]
out, offset = b"", 0
for key, info in header.items():
    if key == "__metadata__":
        continue
    begin, end = info["data_offsets"]
    info["data_offsets"] = [offset, offset + end - begin]
    out += data[begin:end]
    offset += end - begin
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
os.makedirs(dst, exist_ok=True)
with open(os.path.join(dst, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + out)
