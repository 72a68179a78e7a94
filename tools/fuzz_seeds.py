#!/usr/bin/env python3
"""fuzz_seeds.py - writes the seed corpora of dllm's fuzz harnesses (tests/fuzz/corpus/<harness>/) from the
test fixtures, small files only. Run from the repository root; `./build.sh fuzz` then grows the corpora
with the inputs that reach new code.

    python3 tools/fuzz_seeds.py
"""
import hashlib
import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
SEP = b"\n@@\n"  # tests/fuzz/fuzz.cc's file separator


def read(rel):
    with open(os.path.join(ROOT, rel), "rb") as f:
        return f.read()


def seed(harness, data):
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
        f.write(data)


def safetensors(tensors, pad=True):
    """tensors: [(name, dtype, shape, data bytes)]"""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    while pad and (8 + len(h)) % 8:
        h += b" "
    return struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors)


def small_tokenizer_files():
    """tiny-dream's Qwen2 files cut to the 256 byte symbols, the first 60 merges and the added tokens."""
    vocab = json.loads(read("models/tiny-dream/vocab.json"))
    merges = read("models/tiny-dream/merges.txt").decode().split("\n")
    keep_merges = [m for m in merges[1:61] if m]
    keep = {k: v for k, v in vocab.items() if v < 256}
    for m in keep_merges:
        for tok in m.split(" ") + [m.replace(" ", "")]:
            keep.setdefault(tok, vocab[tok])
    config = json.loads(read("models/tiny-dream/tokenizer_config.json"))
    return [json.dumps(keep, ensure_ascii=False).encode(), ("#version: 0.2\n" + "\n".join(keep_merges) + "\n").encode(),
            json.dumps(config, ensure_ascii=False).encode(), read("models/tiny-dream/added_tokens.json")]


def small_tokenizer_json():
    """tiny-llada's tokenizer.json cut the same way (byte symbols, 60 merges, its added tokens)."""
    tj = json.loads(read("models/tiny-llada/tokenizer.json"))
    vocab, merges = tj["model"]["vocab"], tj["model"]["merges"][:60]
    keep = {k: v for k, v in vocab.items() if v < 256}
    for a, b in merges:
        for tok in (a, b, a + b):
            keep.setdefault(tok, vocab[tok])
    tj["model"]["vocab"], tj["model"]["merges"] = keep, merges
    return json.dumps(tj, ensure_ascii=False).encode()


def main():
    configs = ["models/tiny-llada/config.json", "models/tiny-dream/config.json", "models/tiny-add/config.json",
               "tests/data/real-configs/fast-dllm-v2-7b.config.json", "tests/data/real-configs/llada-8b-instruct.config.json",
               "tests/data/tiny-llada/config.json", "tests/data/tiny-dream/config.json"]
    small_json = configs + ["tests/data/tiny-llada/tokenizer_config.json", "tests/data/tiny-dream/tokenizer_config.json",
                            "tests/data/tiny-dream/model.safetensors.index.json", "models/tiny-dream/added_tokens.json",
                            "models/tiny-llada/special_tokens_map.json", "tests/data/tiny-dream/golden_traces.json"]
    for rel in small_json:
        seed("json", read(rel))
    for text in [b'{"a":[1,-2.5e3,true,false,null,"\\u00e9\\ud83d\\ude00\\n"],"b":{}}', b"[[[[[]]]]]", b'"\\udc00"', b"-0.0E+1",
                 b"9223372036854775808", b' {"k" : "v" } ']:
        seed("json", text)
    for rel in configs:
        seed("config", read(rel))
    f32 = struct.pack("<4f", 1.0, -2.0, float("nan"), 0.5)
    seed("safetensors", safetensors([("w", "F32", [2, 2], f32)]))
    seed("safetensors", safetensors([("a", "BF16", [3], b"\x80\x3f" * 3), ("b", "F16", [1], b"\x00\x3c"), ("c", "I64", [], b"\x01" + b"\0" * 7)]))
    seed("safetensors", safetensors([("odd", "F32", [1], f32[:4]), ("e", "F8_E4M3", [0], b"")], pad=False))
    seed("safetensors", safetensors([("f4", "F4", [2, 3], b"\x12\x34\x56")]))
    seed("safetensors", read("tests/data/tiny-dream/golden_logits.safetensors"))
    index = {"metadata": {"total_size": 24}, "weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"}}
    seed("st_index", json.dumps(index).encode())
    seed("st_index", json.dumps({"weight_map": {"z": "b.safetensors"}}).encode())
    seed("st_index", json.dumps({"weight_map": {"x": "../a.safetensors"}}).encode())
    seed("tokenizer_json", small_tokenizer_json())
    files = small_tokenizer_files()
    seed("tokenizer_files", SEP.join(files))
    seed("tokenizer_files", SEP.join(files[:3]))
    seed("tokenizer_files", SEP.join(files + [read("tests/data/tokenizer/qwen2.5/chat_template.jinja")]))
    texts = [b"The quick brown fox jumps over the lazy dog.", b"I'm sure it's John's; THEY'LL", "caf\u00e9 cafe\u0301 \ud55c\uad6d\uc5b4 \u0958".encode(),
             b"def f(x):\n    return {\"a\": [1, 2, 3]}\r\n\r\n  \n", b"<|im_start|>user\nHi<|im_end|>\n<|eot_id|><|mdm_mask|>",
             "\u4f60\u597d \U0001f44d\U0001f3fd 12345 \u0663\u0664".encode(), b"bad \xff\xfe \xc3\x28 \xe2\x82 \xed\xa0\x80 \xc0\xaf\x80"]
    for i, text in enumerate(texts):
        for pick in range(12):  # every tokenizer, parse_special on and off
            if (i + pick) % 3 == 0:
                seed("encode", bytes([pick]) + text)
    for pick in range(12):
        seed("decode", bytes([pick]) + b"".join(struct.pack("<I", v) for v in [0, 1, 200, 255, 300, 1000, 40, 2]))
    seed("chat", b"\x00\x01\x00Hello there \x00\x02\x00  Hi!  \x00\x01\x00What is 2+2?")
    seed("chat", b"\x01\x00\x00You are terse.\x00\x01\x00Hi")
    seed("chat", b"\x02\x01\x00\xff\xc3 <|im_end|>\x00tool\x00x")


if __name__ == "__main__":
    main()
