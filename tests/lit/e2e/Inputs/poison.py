#!/usr/bin/env python3
"""poison.py SRC_DIR DST_DIR NAME: copies a single-file checkpoint with NAME's first value NaN."""
import json
import os
import struct
import sys

src, dst, name = sys.argv[1:4]
blob = bytearray(open(os.path.join(src, "model.safetensors"), "rb").read())
n = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + n])
begin = 8 + n + header[name]["data_offsets"][0]
blob[begin:begin + 4] = struct.pack("<f", float("nan"))
os.makedirs(dst, exist_ok=True)
open(os.path.join(dst, "model.safetensors"), "wb").write(blob)
