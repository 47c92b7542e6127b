#!/usr/bin/env python3
"""flip_bit.py FILE.safetensors NAME [BYTE [BIT]]: flips bit BIT (default 0) of byte BYTE
(default 0) of tensor NAME's data, in place: a file damaged after it was written."""
import json
import struct
import sys

path, name = sys.argv[1:3]
byte = int(sys.argv[3]) if len(sys.argv) > 3 else 0
bit = int(sys.argv[4]) if len(sys.argv) > 4 else 0
blob = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", blob[:8])[0]
begin, end = json.loads(blob[8:8 + n])[name]["data_offsets"]
assert begin + byte < end, "no such byte"
blob[8 + n + begin + byte] ^= 1 << bit
open(path, "wb").write(blob)
