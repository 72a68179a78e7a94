#!/usr/bin/env python3
"""tokenizer_diff.py - differential fuzzing of dllm's tokenizer against Hugging Face `tokenizers`.

Random Unicode, random bytes and mutated real text go through both tokenizers (special tokens parsed and
not, chosen per input); the ids must be identical. dllm sees the bytes; Hugging Face sees
bytes.decode("utf-8", errors="replace"), as dllm's API promises. Run from the repository root with
`pip install tokenizers` (no transformers needed) and nvcc for the dllm side (tools/tokenize_stream.c, built
here into build/tokenize_stream when missing):

    python3 tools/tokenizer_diff.py --count 1000000                 # every vocabulary below
    python3 tools/tokenizer_diff.py --vocab qwen2.5 --count 100000 --seed 7

Vocabularies: qwen2.5 (the Qwen2.5 files of ../shared/models/fast-dllm-v2-7b, or tests/data/tokenizer/qwen2.5),
tiny-llada, tiny-dream, tiny-add (models/), ling (tests/data/tokenizer/ling). Differences are written to
build/tokenizer_diff.<vocab>.jsonl (hex input, parse_special, both id lists); exit status 1 if any.
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time

from tokenizer_oracle import hf_qwen2_pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_QWEN = os.path.join(ROOT, "..", "shared", "models", "fast-dllm-v2-7b")
VOCABS = {
    "qwen2.5": SHARED_QWEN if os.path.exists(os.path.join(SHARED_QWEN, "vocab.json")) else os.path.join(ROOT, "tests/data/tokenizer/qwen2.5"),
    "tiny-llada": os.path.join(ROOT, "models/tiny-llada"),
    "tiny-dream": os.path.join(ROOT, "models/tiny-dream"),
    "tiny-add": os.path.join(ROOT, "models/tiny-add"),
    "ling": os.path.join(ROOT, "tests/data/tokenizer/ling"),
}
STREAM = os.path.join(ROOT, "build", "tokenize_stream")


def hf_tokenizer(d):
    """The Hugging Face pipeline of a directory: tokenizer.json as is, or Qwen2's slow files as transformers
    builds them (tokenizer_oracle.hf_qwen2_pipeline, plus the added tokens of added_tokens.json)."""
    from tokenizers import AddedToken, Tokenizer
    if os.path.exists(os.path.join(d, "tokenizer.json")):
        return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    tok = hf_qwen2_pipeline(d)
    extra = os.path.join(d, "added_tokens.json")
    if os.path.exists(extra):
        with open(extra, encoding="utf-8") as f:
            for content, i in sorted(json.load(f).items(), key=lambda kv: kv[1]):
                if tok.token_to_id(content) is None:
                    tok.add_tokens([AddedToken(content, normalized=True)])
                assert tok.token_to_id(content) == i, (content, i)
    return tok


def build_stream():
    sources = [os.path.join(ROOT, p) for p in ("dllm_cuda.cu", "dllm.h", "tools/tokenize_stream.c")]
    if os.path.exists(STREAM) and all(os.path.getmtime(STREAM) > os.path.getmtime(s) for s in sources):
        return
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    os.makedirs(os.path.dirname(STREAM), exist_ok=True)
    print("building", STREAM, flush=True)
    subprocess.run([nvcc, "-O2", "-std=c++17", "-o", STREAM, "tools/tokenize_stream.c", "dllm_cuda.cu", "-cudart", "static", "-lnvrtc",
                    "-lcublasLt"], cwd=ROOT, check=True)


# ---- Inputs ------------------------------------------------------------------------------------------

RANGES = [  # (weight, lo, hi): where random code points come from
    (30, 0x20, 0x7E), (6, 0x09, 0x0D), (3, 0x00, 0x1F), (6, 0xA0, 0x24F), (4, 0x300, 0x36F), (3, 0x370, 0x52F),
    (2, 0x590, 0x6FF), (2, 0x900, 0x97F), (2, 0xE00, 0xE7F), (2, 0x1100, 0x11FF), (3, 0x2000, 0x206F), (2, 0x2070, 0x22FF),
    (2, 0x3000, 0x30FF), (6, 0x4E00, 0x9FFF), (3, 0xAC00, 0xD7A3), (1, 0xFB00, 0xFFFD), (3, 0x1F300, 0x1FAFF),
    (1, 0x10000, 0x10FFFF), (1, 0xE000, 0xF8FF)]
SPECIAL_CHARS = ["'", "'s", "'LL", "'\u017f", " ", "  ", "\n", "\r\n", "\t", "\u00a0", "\u3000", "\u0301", "\u200d", "\ufe0f", "1", "123",
                 "\u0663", "<|im_end|>", "<|im_start|>", "<|endoftext|>", "<|eot_id|>", "<|mdm_mask|>", "<|start_header_id|>", "[CLS]",
                 "<tool_call>", "<|im_", "|>"]


def random_unicode(rng):
    out = []
    for _ in range(rng.randint(0, 40)):
        if rng.random() < 0.2:
            out.append(rng.choice(SPECIAL_CHARS))
            continue
        _, lo, hi = rng.choices(RANGES, weights=[r[0] for r in RANGES])[0]
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp <= 0xDFFF:
            cp = 0xFFFD
        out.append(chr(cp))
    return "".join(out).encode("utf-8")


def random_bytes(rng):
    n = rng.randint(0, 48)
    if rng.random() < 0.5:  # mostly high bytes: broken and valid multi-byte sequences
        return bytes(rng.choice((rng.randint(0x80, 0xFF), rng.randint(0xC0, 0xF4), rng.randint(0x20, 0x7E))) for _ in range(n))
    return bytes(rng.getrandbits(8) for _ in range(n))


def real_lines():
    lines = []
    for rel in ("tests/data/heldout.txt", "tests/data/prompts.txt", "tests/data/add_test.txt"):
        with open(os.path.join(ROOT, rel), "rb") as f:
            lines += [l for l in f.read().split(b"\n") if l]
    for rel in ("tests/data/tokenizer/qwen2.5.expected.json", "tests/data/tokenizer/ling.expected.json"):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            lines += [bytes.fromhex(c["hex"]) for c in json.load(f)["cases"]]
    return lines


def mutate(rng, text, lines):
    b = bytearray(text)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        at = rng.randint(0, len(b))
        if op == 0:
            b[at:at] = random_unicode(rng)[:8]
        elif op == 1 and b:
            del b[at:at + rng.randint(1, 4)]
        elif op == 2:
            b[at:at] = rng.choice(SPECIAL_CHARS).encode()
        elif op == 3 and b:
            j = rng.randint(0, len(b))
            b[at:at] = b[min(at, j):max(at, j)][:32]
        elif op == 4:
            b[at:at] = rng.choice(lines)[:rng.randint(1, 64)]
        elif op == 5 and b:
            b[at:at + 1] = bytes([rng.getrandbits(8)])
        else:
            b = bytearray(bytes(b).swapcase() if rng.random() < 0.5 else bytes(b).upper())
    return bytes(b)


def inputs(rng, n, lines):
    for _ in range(n):
        r = rng.random()
        if r < 0.4:
            yield random_unicode(rng)
        elif r < 0.6:
            yield random_bytes(rng)
        else:
            yield mutate(rng, rng.choice(lines), lines)


# ---- The comparison ----------------------------------------------------------------------------------

def dllm_encode(d, texts, specials):
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout:
        for t, s in zip(texts, specials):
            fin.write(struct.pack("<I", len(t) | (0x80000000 if s else 0)))
            fin.write(t)
        fin.seek(0)
        subprocess.run([STREAM, d], stdin=fin, stdout=fout, check=True)
        fout.seek(0)
        data = fout.read()
    out, pos = [], 0
    for _ in texts:
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if n == 0xFFFFFFFF:
            out.append(None)
            continue
        out.append(list(struct.unpack_from("<%di" % n, data, pos)))
        pos += 4 * n
    return out


def hf_encode(tok, texts, specials):
    strs = [t.decode("utf-8", errors="replace") for t in texts]
    out = [None] * len(texts)
    for parse in (True, False):
        idx = [i for i, s in enumerate(specials) if s == parse]
        tok.encode_special_tokens = not parse
        for i, e in zip(idx, tok.encode_batch([strs[i] for i in idx], add_special_tokens=False)):
            out[i] = e.ids
    tok.encode_special_tokens = False
    return out


def run_vocab(name, count, seed, batch, lines):
    d = VOCABS[name]
    tok = hf_tokenizer(d)
    rng = random.Random(seed)
    diffs, done, t0 = 0, 0, time.time()
    path = os.path.join(ROOT, "build", "tokenizer_diff.%s.jsonl" % name)
    with open(path, "w") as log:
        while done < count:
            texts = list(inputs(rng, min(batch, count - done), lines))
            specials = [rng.random() < 0.5 for _ in texts]
            ours, theirs = dllm_encode(d, texts, specials), hf_encode(tok, texts, specials)
            for t, s, a, b in zip(texts, specials, ours, theirs):
                if a != b:
                    diffs += 1
                    log.write(json.dumps({"hex": t.hex(), "parse_special": s, "dllm": a, "hf": b}) + "\n")
            done += len(texts)
            log.flush()
            print("%s: %d inputs, %d differences (%.0f s)" % (name, done, diffs, time.time() - t0), flush=True)
    return done, diffs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", choices=sorted(VOCABS) + ["all"], default="all")
    ap.add_argument("--count", type=int, default=100000, help="inputs per vocabulary")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=50000)
    args = ap.parse_args()
    build_stream()
    lines = real_lines()
    total = 0
    for name in (sorted(VOCABS) if args.vocab == "all" else [args.vocab]):
        n, diffs = run_vocab(name, args.count, args.seed, args.batch, lines)
        print("== %s (%s): %d inputs, %d differences" % (name, VOCABS[name], n, diffs), flush=True)
        total += diffs
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
