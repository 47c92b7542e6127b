#!/usr/bin/env python3
"""packed_documents.py: packed-document inputs made wrong on purpose, with struct (safetensors
read and written by hand; no numpy here).

edit SRC DST [--drop NAME] [--set NAME ROW COL VALUE]: SRC's tensors without NAME, or with one
    value of a [B, S] tensor changed.
"""
import argparse
import array
import json
import struct


def write_safetensors(path, tensors):
    """tensors: name -> (dtype "I64" | "I32" | "F32", shape, flat list)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, values) in tensors.items():
        blob = array.array({"F32": "f", "I64": "q", "I32": "i"}[dtype], values).tobytes()
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    data = open(path, "rb").read()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        code = {"F32": "f", "I64": "q", "I32": "i"}[info["dtype"]]
        values = array.array(code)
        values.frombytes(data[8 + size + begin:8 + size + end])
        out[name] = (info["dtype"], info["shape"], list(values))
    return out


def edit(args):
    tensors = read_safetensors(args.src)
    if args.drop:
        del tensors[args.drop]
    if args.set:
        name, row, col, value = args.set[0], int(args.set[1]), int(args.set[2]), int(args.set[3])
        dtype, shape, values = tensors[name]
        values[row * shape[1] + col] = value
    write_safetensors(args.dst, tensors)


parser = argparse.ArgumentParser()
sub = parser.add_subparsers(dest="command", required=True)
e = sub.add_parser("edit")
e.add_argument("src")
e.add_argument("dst")
e.add_argument("--drop")
e.add_argument("--set", nargs=4)
edit(parser.parse_args())
