"""What dllm's fixture generators share: bfloat16 rounding, a safetensors writer and the JSON files of a model
directory. Imported by tools/make_fixtures.py, make_headdim_fixtures.py and make_bd_fixtures.py (run from the
repository root or anywhere: each script's directory is on sys.path)."""

import json
import struct

import numpy as np


def bf16(a):
    """float -> (bfloat16 bits, round to nearest even; the float64 values they hold)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype, shape, raw bytes). Header padded with spaces to 8 bytes."""
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, dtype, shape, raw in sorted(tensors, key=lambda t: t[0]):
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def tokenizer_config(tokens):
    return {"add_bos_token": False, "add_eos_token": False,
            "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                              "single_word": False, "special": True} for i, c in tokens}}
