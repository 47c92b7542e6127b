#!/usr/bin/env python3
"""loss_mask.py: a fine-tuning dataset and its loss mask, read with struct (not hybridcp's reader).

check PREFIX TOKENIZER FORMAT FILE.jsonl
    Decodes each document with the tokenizer.json's vocabulary (byte-level) and checks that it is
    the record rendered as the format says (chat: Granite's template; prompt-completion: prompt,
    completion, <|end_of_text|>), that the mask has the dataset's sequences and documents, uint8,
    and that the tokens whose mask is 1 decode to exactly the learned text: each assistant
    message's content followed by <|end_of_text|> (chat), the completion and <|end_of_text|>.
    Prints "mask matches: N of M tokens count".
retarget PREFIX OUT SEQ VOCAB
    OUT = PREFIX with the same mask, but each masked token at a window's last position (index
    k * (SEQ + 1) + SEQ: a token that is only ever a target, never an input) replaced by another
    id. Prints how many were changed.
plain PREFIX OUT
    OUT = PREFIX's tokens without the mask.
shift-lengths PREFIX
    Moves one value of the mask's sequence 0 into its sequence 1: a well-formed mask whose
    lengths disagree with the dataset's.
"""
import json
import shutil
import struct
import sys


def read_index(path):
    idx = open(path, "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", idx[:9]
    version, code, n, d = struct.unpack_from("<QBQQ", idx, 9)
    at = 9 + 8 + 1 + 8 + 8
    lengths = list(struct.unpack_from(f"<{n}i", idx, at))
    pointers = list(struct.unpack_from(f"<{n}q", idx, at + 4 * n))
    docs = list(struct.unpack_from(f"<{d}q", idx, at + 12 * n))
    return idx, code, lengths, pointers, docs


def read(prefix):
    _, code, lengths, pointers, docs = read_index(prefix + ".idx")
    width, fmt = {1: (1, "B"), 8: (2, "H"), 4: (4, "i")}[code]
    data = open(prefix + ".bin", "rb").read()
    assert len(data) == sum(lengths) * width
    values = list(struct.unpack(f"<{len(data) // width}{fmt}", data))
    return code, lengths, docs, values


def byte_decoder():
    # GPT-2's bytes_to_unicode, inverted.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def decoder(tokenizer):
    t = json.load(open(tokenizer))
    by_id = {i: tok for tok, i in t["model"]["vocab"].items()}
    added = {a["id"]: a["content"] for a in t["added_tokens"]}
    bytes_of = byte_decoder()

    def decode(ids):
        out = b""
        for i in ids:
            out += added[i].encode() if i in added else bytes(bytes_of[c] for c in by_id[i])
        return out.decode()
    return decode


def check(prefix, tokenizer, fmt, jsonl):
    decode = decoder(tokenizer)
    code, lengths, docs, tokens = read(prefix)
    mcode, mlengths, mdocs, mask = read(prefix + ".lossmask")
    assert mcode == 1, mcode
    assert mlengths == lengths and mdocs == docs, "the mask's sequences are not the dataset's"
    assert set(mask) <= {0, 1}
    records = [json.loads(line) for line in open(jsonl) if line.strip()]
    assert len(docs) - 1 == len(records), (len(docs) - 1, len(records))
    starts = [sum(lengths[:docs[k]]) for k in range(len(docs))]
    for k, record in enumerate(records):
        ids, m = tokens[starts[k]:starts[k + 1]], mask[starts[k]:starts[k + 1]]
        if fmt == "chat":
            messages = record["messages"]
            whole = "".join(f"<|start_of_role|>{x['role']}<|end_of_role|>{x['content']}"
                            "<|end_of_text|>\n" for x in messages)
            learned = "".join(x["content"] + "<|end_of_text|>" for x in messages
                              if x["role"] == "assistant")
        else:
            whole = record["prompt"] + record["completion"] + "<|end_of_text|>"
            learned = record["completion"] + "<|end_of_text|>"
            # The prompt, then the learned part: one switch from 0 to 1.
            assert m == sorted(m), m
        assert decode(ids) == whole, (k, decode(ids), whole)
        counted = [i for i, v in zip(ids, m) if v]
        assert decode(counted) == learned, (k, decode(counted), learned)
        if fmt == "chat":
            # The learned runs are whole: each ends with <|end_of_text|> (id 0) and the masked
            # token before each run is <|end_of_role|> (id 2).
            for j in range(len(m)):
                if m[j] and (j == 0 or not m[j - 1]):
                    assert ids[j - 1] == 2, (k, j)
                if m[j] and (j + 1 == len(m) or not m[j + 1]):
                    assert ids[j] == 0, (k, j)
    print(f"mask matches: {sum(mask)} of {len(mask)} tokens count")


def copy(prefix, out, with_mask):
    for suffix in [".bin", ".idx"] + ([".lossmask.bin", ".lossmask.idx"] if with_mask else []):
        shutil.copyfile(prefix + suffix, out + suffix)


def retarget(prefix, out, seq, vocab):
    copy(prefix, out, True)
    code, lengths, docs, tokens = read(prefix)
    _, _, _, mask = read(prefix + ".lossmask")
    width, fmt = {8: (2, "H"), 4: (4, "i")}[code]
    changed = 0
    for p in range(seq, len(tokens), seq + 1):
        if not mask[p]:
            tokens[p] = (tokens[p] + 1) % vocab
            changed += 1
    assert changed > 0, "no masked token at a window's end: lengthen the user turns"
    open(out + ".bin", "wb").write(struct.pack(f"<{len(tokens)}{fmt}", *tokens))
    print(f"retargeted {changed} masked targets")


def shift_lengths(prefix):
    path = prefix + ".lossmask.idx"
    idx, code, lengths, pointers, docs = read_index(path)
    n = len(lengths)
    assert n >= 2
    lengths[0] -= 1
    lengths[1] += 1
    pointers[1] -= 1
    at = 9 + 8 + 1 + 8 + 8
    idx = idx[:at] + struct.pack(f"<{n}i", *lengths) + struct.pack(f"<{n}q", *pointers) + \
        idx[at + 12 * n:]
    open(path, "wb").write(idx)


command = sys.argv[1]
if command == "check":
    check(*sys.argv[2:6])
elif command == "retarget":
    retarget(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
elif command == "plain":
    copy(sys.argv[2], sys.argv[3], False)
elif command == "shift-lengths":
    shift_lengths(sys.argv[2])
else:
    sys.exit(f"unknown command {command}")
