#!/usr/bin/env python3
"""packed_documents.py: packed-document inputs and the reference they must equal, with struct
(safetensors read and written by hand; no numpy here).

make OUT --batch B --seq S --vocab V --rows "1,5,2;13,...": the rows' documents by length
    Writes OUT/packed.safetensors (input_ids, targets, position_ids [B, S], I64) and, for each
    document k, OUT/doc-K.safetensors (input_ids, targets [1, L]) and OUT/docs.txt (K L per line).
    Targets are the next token within the document: -100 at each document's last token (as the
    document alone has none) and on a span inside the longest document (masked targets).
edit SRC DST [--drop NAME] [--set NAME ROW COL VALUE]: SRC's tensors without NAME, or with one
    value of a [B, S] tensor changed.
combine OUT RESULT_0 RESULT_1 ...: RESULT_K is `hybridcp run-step --save` of document K alone
    (its loss the mean over its valid targets, its gradients those of that mean). Writes
    OUT/reference.safetensors: the packed batch's loss, the per-token losses summed over every
    document and divided by the batch's valid targets, and the gradients accumulated alike
    (each document's weighted by its valid targets): what the packed step must give.
"""
import argparse
import array
import json
import os
import random
import struct
import sys


def write_safetensors(path, tensors):
    """tensors: name -> (dtype "I64" | "F32", shape, flat list)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, values) in tensors.items():
        blob = array.array("q" if dtype == "I64" else "f", values).tobytes()
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


def make(args):
    rows = [[int(n) for n in row.split(",")] for row in args.rows.split(";")]
    assert len(rows) == args.batch and all(sum(r) == args.seq for r in rows), rows
    rng = random.Random(7)
    ids, targets, positions, docs = [], [], [], []
    longest = max((n, b, k) for b, row in enumerate(rows) for k, n in enumerate(row))
    for b, row in enumerate(rows):
        for k, n in enumerate(row):
            doc = [rng.randrange(args.vocab) for _ in range(n)]
            tgt = doc[1:] + [-100]
            if (n, b, k) == longest:  # a masked span inside a document
                for i in range(n // 3, n // 3 + 4):
                    tgt[i] = -100
            ids += doc
            targets += tgt
            positions += list(range(n))
            docs.append((doc, tgt))
    os.makedirs(args.out, exist_ok=True)
    shape = [args.batch, args.seq]
    write_safetensors(os.path.join(args.out, "packed.safetensors"),
                      {"input_ids": ("I64", shape, ids), "targets": ("I64", shape, targets),
                       "position_ids": ("I64", shape, positions)})
    with open(os.path.join(args.out, "docs.txt"), "w") as f:
        for k, (doc, tgt) in enumerate(docs):
            write_safetensors(os.path.join(args.out, f"doc-{k}.safetensors"),
                              {"input_ids": ("I64", [1, len(doc)], doc),
                               "targets": ("I64", [1, len(doc)], tgt)})
            f.write(f"{k} {len(doc)}\n")
    valid = sum(t != -100 for t in targets)
    print(f"{len(docs)} documents in {args.batch} rows of {args.seq}, {valid} valid targets")


def combine(args):
    valids = []
    for k in range(len(args.results)):
        _, _, tgt = read_safetensors(os.path.join(args.out, f"doc-{k}.safetensors"))["targets"]
        valids.append(sum(t != -100 for t in tgt))
    total = sum(valids)
    loss, grads = 0.0, {}
    for valid, path in zip(valids, args.results):
        result = read_safetensors(path)
        weight = valid / total
        loss += weight * result["loss"][2][0]
        for name, (dtype, shape, values) in result.items():
            if not name.startswith("grad."):
                continue
            acc = grads.setdefault(name, (shape, [0.0] * len(values)))[1]
            for i, v in enumerate(values):
                acc[i] += weight * v
    tensors = {"loss": ("F32", [1], [loss])}
    for name, (shape, values) in grads.items():
        tensors[name] = ("F32", shape, values)
    write_safetensors(os.path.join(args.out, "reference.safetensors"), tensors)
    print(f"reference: {len(valids)} documents, {total} valid targets, loss {loss:.7f}")


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
m = sub.add_parser("make")
m.add_argument("out")
m.add_argument("--batch", type=int, required=True)
m.add_argument("--seq", type=int, required=True)
m.add_argument("--vocab", type=int, required=True)
m.add_argument("--rows", required=True)
c = sub.add_parser("combine")
c.add_argument("out")
c.add_argument("results", nargs="+")
e = sub.add_parser("edit")
e.add_argument("src")
e.add_argument("dst")
e.add_argument("--drop")
e.add_argument("--set", nargs=4)
args = parser.parse_args()
{"make": make, "combine": combine, "edit": edit}[args.command](args)
