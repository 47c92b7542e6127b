#!/usr/bin/env python3
"""megatron_dataset.py PREFIX [options]: writes PREFIX.bin and PREFIX.idx as Megatron-LM's
indexed dataset builder lays them out, with struct.pack (independent of hybridcp's writer).

The documents are byte-level tokens (0-255, each document ending with EOS 257, as the demo model
expects), made up from a fixed pattern; every other document is split into two sequences, as
preprocess_data.py does with sentence splitting, so the document index is not simply 0..N.

Options:
  --dtype uint16|int32   the token type (Megatron's codes 8 and 4)
  --documents N          how many documents (default 20)
  --first K              start at document K of the pattern (another dataset of the same kind)
  --bad-token DOC        token 1000 (beyond the demo model's vocab of 320) at position 3 of
                         document DOC
  --raw FILE             also write the same token stream as a headerless uint16 file
  --short-bin            drop the last token from PREFIX.bin (the .idx then disagrees with it)
"""
import argparse
import struct

CODES = {"uint16": (8, "<H"), "int32": (4, "<i")}
EOS = 257

parser = argparse.ArgumentParser()
parser.add_argument("prefix")
parser.add_argument("--dtype", default="uint16", choices=sorted(CODES))
parser.add_argument("--documents", type=int, default=20)
parser.add_argument("--first", type=int, default=0)
parser.add_argument("--bad-token", type=int, default=-1)
parser.add_argument("--raw")
parser.add_argument("--short-bin", action="store_true")
args = parser.parse_args()
code, fmt = CODES[args.dtype]
width = struct.calcsize(fmt)

documents = []
for k in range(args.first, args.first + args.documents):
    length = 40 + (k * 17) % 50
    tokens = [(k * 7 + i * 13 + (i * i) % 11) % 256 for i in range(length)] + [EOS]
    if k == args.bad_token:
        tokens[3] = 1000
    documents.append(tokens)

# Sequences: a document is one sequence, or two (split in the middle) for odd k.
sequences = []
doc_index = [0]
for k, tokens in enumerate(documents):
    if k % 2 == 1:
        half = len(tokens) // 2
        sequences += [tokens[:half], tokens[half:]]
    else:
        sequences.append(tokens)
    doc_index.append(len(sequences))

stream = [t for s in sequences for t in s]
with open(args.prefix + ".bin", "wb") as f:
    kept = stream[:-1] if args.short_bin else stream
    f.write(b"".join(struct.pack(fmt, t) for t in kept))

pointers, offset = [], 0
for s in sequences:
    pointers.append(offset)
    offset += len(s) * width
with open(args.prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00")
    f.write(struct.pack("<Q", 1))
    f.write(struct.pack("<B", code))
    f.write(struct.pack("<Q", len(sequences)))
    f.write(struct.pack("<Q", len(doc_index)))
    f.write(struct.pack(f"<{len(sequences)}i", *[len(s) for s in sequences]))
    f.write(struct.pack(f"<{len(pointers)}q", *pointers))
    f.write(struct.pack(f"<{len(doc_index)}q", *doc_index))

if args.raw:
    with open(args.raw, "wb") as f:
        f.write(struct.pack(f"<{len(stream)}H", *stream))

print(f"{args.prefix}: {len(documents)} documents, {len(sequences)} sequences, "
      f"{len(stream)} tokens")
