#!/usr/bin/env python3
"""poison.py SRC_DIR DST_DIR NAME [--value X] [--element K] [--checksums keep|fix|strip]

Copies SRC_DIR/model.safetensors (a single-file checkpoint) to DST_DIR (the same directory
rewrites it in place) with element K (default 0) of F32 tensor NAME set to X (default nan).
--checksums says what happens to hybridcp's tensor checksums in __metadata__: keep them (the
default: the file looks damaged after it was written), fix NAME's (as if a writer had stored
the value), or strip them all (a file of another tool, as Hugging Face writes them).
"""
import argparse
import json
import os
import struct

PREFIX = "hybridcp.crc32c."


def crc32c(data):
    table = []
    for b in range(256):
        crc = b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    crc = 0xFFFFFFFF
    for byte in data:
        crc = (crc >> 8) ^ table[(crc ^ byte) & 0xFF]
    return crc ^ 0xFFFFFFFF


parser = argparse.ArgumentParser()
parser.add_argument("src")
parser.add_argument("dst")
parser.add_argument("name")
parser.add_argument("--value", type=float, default=float("nan"))
parser.add_argument("--element", type=int, default=0)
parser.add_argument("--checksums", choices=["keep", "fix", "strip"], default="keep")
args = parser.parse_args()

blob = open(os.path.join(args.src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + n])
data = bytearray(blob[8 + n:])
entry = header[args.name]
assert entry["dtype"] == "F32", entry
begin, end = entry["data_offsets"]
at = begin + 4 * args.element
assert at + 4 <= end, "no such element"
data[at:at + 4] = struct.pack("<f", args.value)

metadata = header.get("__metadata__", {})
if args.checksums == "fix":
    metadata[PREFIX + args.name] = "%08x" % crc32c(bytes(data[begin:end]))
elif args.checksums == "strip":
    for key in [k for k in metadata if k.startswith(PREFIX)]:
        del metadata[key]
if metadata:
    header["__metadata__"] = metadata
else:
    header.pop("__metadata__", None)
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
os.makedirs(args.dst, exist_ok=True)
with open(os.path.join(args.dst, "model.safetensors"), "wb") as out:
    out.write(struct.pack("<Q", len(text)) + text + bytes(data))
