#!/usr/bin/env python3
"""safetensors_dtypes.py FILE...: per file, its tensor count, their dtypes, the metadata's format,
and how many of its tensors are masters (tensors named as a model parameter, not as a moment)."""
import json
import struct
import sys

for path in sys.argv[1:]:
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
    metadata = header.pop("__metadata__", {})
    dtypes = ",".join(sorted({t["dtype"] for t in header.values()}))
    line = f"{path}: {len(header)} tensors, {dtypes}, format {metadata.get('format')}"
    if "/optimizer/" in path:
        masters = [n for n in header if not n.endswith((".exp_avg", ".exp_avg_sq"))]
        line += f", masters of {len(masters)}"
    print(line)
