#!/usr/bin/env python3
"""bench_tokenizer.py TOKENIZER.json CORPUS_DIR OUT.u16 [--batch]: Hugging Face tokenizers on the
files of CORPUS_DIR (a document each, in sorted order, each followed by the end-of-text token 0),
the way `hybridcp tokenize` does them: writes the ids as uint16 to OUT.u16 for comparison and
prints MB/s on one thread (encode, one document after another) or with --batch on all cores
(encode_batch)."""
import glob
import os
import sys
import time

import numpy
import tokenizers

path, corpus, out = sys.argv[1:4]
batch = "--batch" in sys.argv
tok = tokenizers.Tokenizer.from_file(path)
texts = [open(f, encoding="utf-8").read() for f in sorted(glob.glob(os.path.join(corpus, "*")))]
total = sum(len(t.encode("utf-8")) for t in texts)
start = time.perf_counter()
if batch:
    encodings = tok.encode_batch(texts, add_special_tokens=False)
else:
    encodings = [tok.encode(t, add_special_tokens=False) for t in texts]
seconds = time.perf_counter() - start
ids = []
for e in encodings:
    ids.extend(e.ids)
    ids.append(0)
numpy.array(ids, dtype=numpy.uint16).tofile(out)
print(f"tokenizers {tokenizers.__version__} {'encode_batch' if batch else 'encode, one thread'}: "
      f"{total / 1e6:.1f} MB in {seconds:.2f} s: {total / 1e6 / seconds:.1f} MB/s, {len(ids)} ids")
