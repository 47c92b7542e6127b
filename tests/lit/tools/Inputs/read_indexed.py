#!/usr/bin/env python3
"""read_indexed.py PREFIX [GOLDEN TEXT...]: reads a Megatron indexed dataset with struct (not
hybridcp's reader) and prints its counts; with a golden file (tests/fixtures/tokenizer/goldens)
and texts, checks that document k holds the golden ids of text k followed by the end-of-text id
given as --eos, and prints "documents match"."""
import argparse
import json
import struct

parser = argparse.ArgumentParser()
parser.add_argument("prefix")
parser.add_argument("--golden")
parser.add_argument("--eos", type=int, default=0)
parser.add_argument("texts", nargs="*")
args = parser.parse_intermixed_args()

idx = open(args.prefix + ".idx", "rb").read()
assert idx[:9] == b"MMIDIDX\x00\x00", idx[:9]
version, code, sequences, documents = struct.unpack_from("<QBQQ", idx, 9)
assert version == 1
at = 9 + 8 + 1 + 8 + 8
lengths = struct.unpack_from(f"<{sequences}i", idx, at)
pointers = struct.unpack_from(f"<{sequences}q", idx, at + 4 * sequences)
doc_index = struct.unpack_from(f"<{documents}q", idx, at + 12 * sequences)
width, fmt = {8: (2, "H"), 4: (4, "i")}[code]
data = open(args.prefix + ".bin", "rb").read()
assert len(data) == sum(lengths) * width
tokens = struct.unpack(f"<{len(data) // width}{fmt}", data)
print(f"dtype code {code}, {sequences} sequences, {documents - 1} documents, {len(tokens)} tokens")

if args.golden:
    cases = {c["text"]: c["ids"] for c in json.load(open(args.golden))["cases"]}
    for k, text in enumerate(args.texts):
        start = pointers[doc_index[k]] // width
        got = list(tokens[start:start + lengths[doc_index[k]]])
        want = cases[text] + [args.eos]
        assert got == want, (k, text, got, want)
    print("documents match")
