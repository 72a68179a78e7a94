#!/usr/bin/env python3
"""train_tiny.py - trains dllm's four tiny masked-diffusion LMs and ships them as Hugging Face checkpoints.

  tiny-llada  LLaDA layout, tensor names and config schema (model_type llada), LLaDA's masked-diffusion
              pre-training objective on the quotes of Debian's `fortunes` package, with a byte-level BPE
              tokenizer.json (Ling/LLaDA split regex, LLaDA's special-token strings, LLaDA's chat template).
  tiny-dream  Dream/Qwen2 layout (GQA, q/k/v bias, untied head, logit shift), same corpus and objective, with a
              Qwen2-regex BPE shipped the way Dream ships it: vocab.json + merges.txt + tokenizer_config.json.
  tiny-add    LLaDA layout, SFT on 5-digit + 5-digit addition (the prompt is never masked), Ling tokenizer.
  tiny-llada2 LLaDA2.0's mixture-of-experts layout, tensor names and config schema (model_type llada2_moe; layer 0
              dense, 3 MoE layers of 16 experts, top-4 in 2 of 4 groups, one shared expert; QK-norm, partial RoPE),
              tiny-llada's objective and corpus under LLaDA2's block-causal attention (tools/tiny_llada2.py), a
              Ling BPE with LLaDA2's <|endoftext|> / <|mask|> / role tokens and its chat format.

Every model directory gets BF16 model.safetensors, config.json, tokenizer files, generation_config.json and a
model card (README.md + model_card.json): data, hyper-parameters, seeds, wall time, losses, and evaluation
numbers computed on the exported BF16 weights with the float64 reference forward of tools/make_fixtures.py,
so that dllm's C CPU reference can reproduce them. The masked-token NLL protocol is NLL_PROTOCOL below.

Device run (one H200, torch >= 2.1 with `tokenizers`; carry .carry/fortunes, the text files of Debian's
`fortunes` package). Training takes 3.0 + 2.0 + 2.0 minutes (--minutes), tokenizers, export and evaluation
under a minute more. Everything the repository needs lands under $OUT/repo, then is packed into 15 MiB parts
because the device returns at most 8 files of 16 MiB (about 33 MB of checkpoints: 3 parts and the log):
    set -o pipefail; python3 tools/train_tiny.py --out $OUT/repo/models --data-out $OUT/repo/tests/data \
      2>&1 | tee $OUT/train_tiny.log && tar -C $OUT/repo -cf - . | split -b 15m -d - $OUT/tiny-models.tar. \
      && rm -rf $OUT/repo
Unpack into a checkout:  cat tiny-models.tar.* | tar -xf - -C /path/to/dllm   (models/ and tests/data/)
One model again, e.g. a longer tiny-add (heldout.txt and add_test.txt come out identical; the tokenizers are
trained again and each model directory carries its own; only the chosen model's budget counts; --minutes and
--steps take 3 or 4 values in RECIPES order):
    ... train_tiny.py --only tiny-add --minutes 0 0 3 --out ... --data-out ...
tiny-llada2 alone (2.0 minutes of training; about 3 MB of BF16, packed the same way):
    set -o pipefail; python3 tools/train_tiny.py --only tiny-llada2 --out $OUT/repo/models \
      --data-out $OUT/repo/tests/data 2>&1 | tee $OUT/train_tiny.log && tar -C $OUT/repo -cf - . \
      | split -b 15m -d - $OUT/tiny-llada2.tar. && rm -rf $OUT/repo

Local smoke run (CPU, torch >= 1.13, numpy; no `tokenizers`: byte-level vocabularies without merges, tiny
dimensions, 12 s of training per model, a few minutes in all; then build/dllm-generate, if built, must load
and decode every exported model, and give tiny-llada2's reference samples):
    python3 tools/train_tiny.py --smoke                       # writes build/smoke/{models,tests/data}
"""
import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import platform
import random
import struct
import subprocess
import sys
import time
import unicodedata

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS_DIR)
from fixture_files import write_json, write_safetensors  # noqa: E402
import tiny_llada2  # noqa: E402
from tokenizer_oracle import bytes_to_unicode  # noqa: E402
from make_fixtures import (DREAM_CFG, LLADA_CFG, Model, bf16_round, dream_specs, generate, llada_specs,  # noqa: E402
                           make_weights, rope, rope_tables, truncate, uniform)

# ----------------------------------------------------------------------------------------------------
# Protocols and fixed choices
# ----------------------------------------------------------------------------------------------------
MASK_EPS = 1e-3  # LLaDA GUIDELINES.md: a position is masked with probability p = (1 - eps) t + eps, t ~ U(0, 1)
TRUNCATE_FRACTION = 0.01  # GUIDELINES.md: 1% of pre-training batches are cut to a random length

NLL_RATIOS = (0.15, 0.5, 0.9)
NLL_SEED, NLL_STREAM = 1234, 3  # stream 3 of dllm's Philox draws is reserved for this protocol
NLL_WINDOW, NLL_WINDOWS = 128, 64

# The masked-token NLL protocol. dllm-eval (C) implements the same; the model cards quote this text.
NLL_PROTOCOL = (
    "Masked-token NLL, dllm protocol 1. (1) Read tests/data/heldout.txt as one UTF-8 string and tokenize it with "
    "the model's tokenizer: special-token text is not parsed (the file holds no added-token text, so this cannot "
    "matter), no BOS/EOS is added. (2) Cut the id stream into "
    "consecutive windows of 128 ids from id 0, drop the last partial window, keep the first 64 windows "
    "(w = 0..63). (3) For mask ratio r_k in (0.15, 0.5, 0.9), k = 0, 1, 2: position i (0..127) of window w is "
    "masked iff uniform(seed=1234, index=i, position=w, step=k, stream=3) < r_k, where uniform is dllm's "
    "Philox4x32-10 draw (dllm__uniform in dllm_cuda.cu, uniform() in tools/make_fixtures.py: counter "
    "(index, position, step, stream), key (seed mod 2^32, seed div 2^32), u = ((o0 << 32 | o1) >> 11 + 0.5) "
    "* 2^-53). (4) Masked positions take the model's mask_token_id; each window alone (128 ids, no padding, no "
    "prompt) goes through one full bidirectional forward; for Dream the logit shift is applied (position i is "
    "scored with output row i-1, position 0 with row 0). (5) NLL_k = sum over the masked positions of all 64 "
    "windows of -log softmax(logits_i)[true id_i], over all logit columns, computed in float64, divided by "
    "the number of masked positions. Reported in nats per token, with the masked-position counts.")

HELDOUT_EVERY, HELDOUT_AT, VALIDATION_AT = 20, 19, 9
SPLIT_RULE = ("quotes are numbered k = 0, 1, ... in file order (files sorted by name, each split on lines that "
              "are exactly '%', surrounding newlines stripped, empty quotes dropped); k % 20 == 19: held out "
              "(tests/data/heldout.txt, never trained on); k % 20 == 9: validation (monitoring and checkpoint "
              "choice); all others: training")
FORTUNES_SOURCE = ("Debian package fortunes 1:1.99.1-7.3 (Debian 12 bookworm; source package fortune-mod), "
                   "the text files of /usr/share/games/fortunes")

ADD_DIGITS, ADD_ANSWER_LEN = 5, 8  # sums have 5 or 6 digits; the rest of the 8-token answer is <|endoftext|>
ADD_TEST_N, ADD_TEST_SEED = 500, 7

SAMPLE_PROMPTS = ("The best way to predict the future is",
                  "Q: How many programmers does it take to change a light bulb?\nA:")

CALIBRATE_FROM, CALIBRATE_SHARE = 10, 0.05  # time steps 10.. for 5% of the budget to fit the step count to it


@dataclasses.dataclass
class Recipe:
    name: str
    family: str        # "llada" or "dream": tensor names, config schema, logit shift
    task: str          # "text": pre-training on the corpus; "add": SFT on addition
    d_model: int
    n_layers: int
    n_heads: int       # head_dim = d_model / n_heads = 64: dllm's GPU kernels take 64 or 128
    n_kv_heads: int
    mlp_hidden: int
    seq_len: int       # training row length, written as the config's context length
    batch: int
    lr: float
    warmup: int
    weight_decay: float
    dropout: float     # residual dropout after the attention and MLP outputs
    minutes: float
    seed: int
    steps: int = 0     # 0: as many steps as fit in `minutes`
    log_every: int = 100
    n_evals: int = 10  # validation passes during the run; the best one's weights are exported
    # LLaDA2's mixture of experts (family "llada2" only): the first n_dense layers are dense SwiGLU (mlp_hidden),
    # the others route each token to experts_per_tok of n_experts (n_group groups, topk_group kept) plus n_shared
    n_experts: int = 0
    experts_per_tok: int = 0
    n_group: int = 1
    topk_group: int = 1
    moe_hidden: int = 0
    n_shared: int = 0
    n_dense: int = 0
    vocab: int = 0     # this model's tokenizer size (its kind's), 0: --vocab


ADD_SEQ_LEN = 2 * ADD_DIGITS + 2 + ADD_ANSWER_LEN
RECIPES = [
    Recipe("tiny-llada", "llada", "text", 256, 8, 4, 4, 640, 256, 128, 1e-3, 200, 0.1, 0.1, 3.0, 11),
    Recipe("tiny-dream", "dream", "text", 256, 6, 4, 2, 640, 256, 128, 1e-3, 200, 0.1, 0.1, 2.0, 12),
    Recipe("tiny-add", "llada", "add", 128, 4, 2, 2, 384, ADD_SEQ_LEN, 1024, 2e-3, 100, 0.01, 0.0, 2.0, 13),
    # LLaDA2.0-mini's proportions shrunk: 16 experts in 4 groups (keep 2), top-4, one shared, layer 0 dense; d_model
    # 128 and 2048 tokens keep the checkpoint at 3 MB (the device machine takes a 64 MiB working tree)
    Recipe("tiny-llada2", "llada2", "text", 128, 4, 2, 1, 384, 256, 128, 2e-3, 200, 0.1, 0.1, 2.0, 15,
           n_experts=16, experts_per_tok=4, n_group=4, topk_group=2, moe_hidden=32, n_shared=1, n_dense=1,
           vocab=2048),
]


def smoke_recipe(r):
    """Same pipeline, dimensions a CPU trains in seconds."""
    text = r.task == "text"
    return dataclasses.replace(r, d_model=128, n_layers=2, n_heads=2, n_kv_heads=2 if r.family == "llada" else 1,
                               mlp_hidden=256, seq_len=128 if text else r.seq_len, batch=4 if text else 64,
                               lr=3e-3, warmup=20, minutes=0.2, log_every=5, n_evals=2)


# ----------------------------------------------------------------------------------------------------
# Corpus: the fortunes quotes, the fixed split, the test files
# ----------------------------------------------------------------------------------------------------
def read_quotes(folder):
    """All quotes of the fortune files in `folder`, in file order, and a record of what was read."""
    names = sorted(n for n in os.listdir(folder)
                   if os.path.isfile(os.path.join(folder, n)) and not n.endswith((".dat", ".u8")))
    if not names:
        raise SystemExit(f"train_tiny: no fortune files in {folder} (carry .carry/fortunes)")
    quotes, digest, n_bytes = [], hashlib.sha256(), 0
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            raw = f.read()
        digest.update(name.encode() + b"\0" + raw)
        n_bytes += len(raw)
        lines = []
        for line in raw.decode("utf-8").split("\n") + ["%"]:
            if line != "%":
                lines.append(line)
                continue
            quote = "\n".join(lines).strip("\n")
            if quote.strip():
                quotes.append(quote)
            lines = []
    return quotes, {"files": names, "bytes": n_bytes, "sha256": digest.hexdigest(), "quotes": len(quotes)}


def split_quotes(quotes):
    parts = {"train": [], "validation": [], "heldout": []}
    for k, quote in enumerate(quotes):
        role = ("heldout" if k % HELDOUT_EVERY == HELDOUT_AT else
                "validation" if k % HELDOUT_EVERY == VALIDATION_AT else "train")
        parts[role].append(quote)
    return parts


def fortune_file_text(quotes):
    """The quotes in fortune-file format, so heldout.txt is itself a valid fortunes file."""
    return "".join(q + "\n%\n" for q in quotes)


def addition_problems(n, seed):
    """Python's Mersenne Twister: the same problems on every machine (numpy's Generator may change streams)."""
    rng = random.Random(seed)
    lo, hi = 10 ** (ADD_DIGITS - 1), 10 ** ADD_DIGITS - 1
    return [(rng.randint(lo, hi), rng.randint(lo, hi)) for _ in range(n)]


def write_text(path, text):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


# ----------------------------------------------------------------------------------------------------
# Tokenizers: byte-level BPE with BPE ids first and the added tokens after them, as in LLaDA and Qwen
# ----------------------------------------------------------------------------------------------------
LING_PATTERN = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|"
                r"\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclasses.dataclass
class TokenizerKind:
    name: str
    pattern: str
    nfc: bool
    specials: list     # (content, special) in id order, after the BPE ids
    bos: str
    eos: str
    eot: str
    mask: str
    chat_template: str  # file under tools/chat_templates: the real model's (LLaDA2: its format); None: none


# LLaDA's added tokens (models.md 1.4) in their real order, without the 256 reserved ones.
LING = TokenizerKind(
    "ling", LING_PATTERN, False,
    [(c, True) for c in ("<|startoftext|>", "<|endoftext|>", "[CLS]", "[gMASK]", "<|mdm_mask|>", "<role>", "</role>",
                         "<|arithmetic_start|>", "<|arithmetic_end|>", "<|number_start|>", "<|number_end|>",
                         "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")],
    "<|startoftext|>", "<|endoftext|>", "<|eot_id|>", "<|mdm_mask|>", "llada-8b-instruct.jinja")

# Qwen2.5's added tokens (with their special flags) followed by Dream's two.
QWEN2 = TokenizerKind(
    "qwen2", QWEN2_PATTERN, True,
    [(c, True) for c in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                         "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                         "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")]
    + [(c, False) for c in ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                            "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")]
    + [("<|beginoftext|>", True), ("<|mask|>", True)],
    "<|beginoftext|>", "<|endoftext|>", "<|im_end|>", "<|mask|>", "qwen2.5-chatml.jinja")

# LLaDA2's tokens that dllm and the chat format use: <|startoftext|> and <|endoftext|> (EOS and pad) first as in
# the real vocabulary (156891, 156892), the mask three ids after EOS where LLaDA2's generate puts it (156895), the
# role markers of its chat template. The rest of the real added tokens and their order are not reproduced (Ling
# 2.0's tokenizer names 156895 <|role_end|>; what LLaDA2's calls it was not found). The chat template writes
# LLaDA2's format (src/tokenizer/chat.cpp names its sources), which dllm recognises as DLLM_CHAT_LLADA2.
LING2 = TokenizerKind(
    "ling2", LING_PATTERN, False,
    [(c, True) for c in ("<|startoftext|>", "<|endoftext|>", "[CLS]", "[gMASK]", "<|mask|>", "<role>", "</role>",
                         "<|role_end|>")],
    "<|startoftext|>", "<|endoftext|>", "<|role_end|>", "<|mask|>", "llada2.jinja")


BYTE_SYMBOL = bytes_to_unicode()  # GPT-2's byte-level alphabet
SYMBOL_BYTE = {s: b for b, s in BYTE_SYMBOL.items()}


class ByteBPE:
    """A byte-level BPE tokenizer: `vocab` (symbol string -> id, ids 0..n-1), `merges` in rank order, then the
    kind's added tokens. Encoding goes through Hugging Face `tokenizers` loaded from the very JSON this class
    writes, so what is measured is what ships; without `tokenizers` (smoke runs) only merge-free vocabularies
    are supported, where BPE is one token per byte."""

    def __init__(self, kind, vocab, merges, use_hf):
        self.kind, self.vocab, self.merges = kind, vocab, merges
        self.symbols = {i: s for s, i in vocab.items()}
        self.added = [(len(vocab) + k, content, special) for k, (content, special) in enumerate(kind.specials)]
        self.added_ids = {content: i for i, content, _ in self.added}
        self.added_by_id = {i: content for i, content, _ in self.added}
        self.n_vocab = len(vocab) + len(self.added)
        self.hf = None
        if use_hf:
            from tokenizers import Tokenizer
            self.hf = Tokenizer.from_str(json.dumps(self.tokenizer_json()))
            # The protocol treats special-token text as plain text (check_tokenizer also makes sure the
            # corpus holds none, so an older `tokenizers` without this switch gives the same ids).
            with contextlib.suppress(AttributeError):
                self.hf.encode_special_tokens = True
        elif merges:
            raise ValueError("encoding with merges needs the `tokenizers` package")

    def special(self, content):
        return self.added_ids[content]

    def encode_batch(self, texts):
        if self.hf is not None:
            return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]
        norm = (lambda t: unicodedata.normalize("NFC", t)) if self.kind.nfc else (lambda t: t)
        return [[self.vocab[BYTE_SYMBOL[b]] for b in norm(t).encode("utf-8")] for t in texts]

    def encode(self, text):
        return self.encode_batch([text])[0]

    def single_id(self, text):
        ids = self.encode(text)
        assert len(ids) == 1, f"{text!r} is not one token: {ids}"
        return ids[0]

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            if i in self.added_by_id:
                out += self.added_by_id[i].encode("utf-8")
            else:
                out += bytes(SYMBOL_BYTE[ch] for ch in self.symbols[i])
        return out.decode("utf-8", errors="replace")

    # -- the files ------------------------------------------------------------------------------------
    def tokenizer_json(self):
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
        return {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": s} for i, c, s in self.added],
            "normalizer": {"type": "NFC"} if self.kind.nfc else None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": self.kind.pattern}, "behavior": "Isolated", "invert": False},
                byte_level]},
            "post_processor": byte_level,
            "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": self.vocab, "merges": [[a, b] for a, b in self.merges]},
        }

    def added_tokens_decoder(self):
        return {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                         "special": s} for i, c, s in self.added}

    def chat_template(self):
        if self.kind.chat_template is None:
            return None
        with open(os.path.join(TOOLS_DIR, "chat_templates", self.kind.chat_template), encoding="utf-8") as f:
            return f.read()

    def save(self, folder):
        """LLaDA's layout (tokenizer.json) for the Ling kind, Dream's (vocab.json + merges.txt) for Qwen2."""
        if self.kind is not QWEN2:
            with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(self.tokenizer_json(), f, ensure_ascii=False, indent=2)  # as `tokenizers` saves it
            config = ling_tokenizer_config(self)
            extra = {"additional_special_tokens": config["additional_special_tokens"],
                     "bos_token": self.kind.bos, "cls_token": "[CLS]", "eos_token": self.kind.eos,
                     "pad_token": self.kind.eos}
            if self.kind is LING2:
                extra["mask_token"] = self.kind.mask
        else:
            with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
                json.dump(self.vocab, f, ensure_ascii=False, separators=(",", ":"))
            write_text(os.path.join(folder, "merges.txt"), "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in self.merges))
            write_json(os.path.join(folder, "added_tokens.json"), {c: i for i, c, _ in sorted(self.added, key=lambda t: t[1])})
            config = qwen2_tokenizer_config(self)
            extra = {"additional_special_tokens": config["additional_special_tokens"], "bos_token": self.kind.bos,
                     "eos_token": self.kind.eos, "mask_token": self.kind.mask, "pad_token": self.kind.eos}
        write_json(os.path.join(folder, "tokenizer_config.json"), config)
        write_json(os.path.join(folder, "special_tokens_map.json"), extra)

    def describe(self):
        return {"kind": self.kind.name, "split_regex": self.kind.pattern, "normalizer": "NFC" if self.kind.nfc else None,
                "bpe_tokens": len(self.vocab), "merges": len(self.merges), "n_vocab": self.n_vocab,
                "added_tokens": {c: i for i, c, _ in self.added}}


def ling_tokenizer_config(tok):
    """LLaDA-8B-Instruct's tokenizer_config.json with this vocabulary's ids (trust_remote_code dropped); for
    LLaDA2 the same keys with its mask token and role markers."""
    if tok.kind is LING2:
        return {"add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": tok.added_tokens_decoder(),
                "additional_special_tokens": ["<role>", "</role>", "<|role_end|>"], "bos_token": tok.kind.bos,
                "chat_template": tok.chat_template(), "clean_up_tokenization_spaces": False, "cls_token": "[CLS]",
                "eos_token": tok.kind.eos, "fast_tokenizer": True, "gmask_token": "[gMASK]",
                "mask_token": tok.kind.mask, "model_input_names": ["input_ids", "attention_mask"],
                "model_max_length": 1000000000000000019884624838656, "pad_token": tok.kind.eos,
                "tokenizer_class": "PreTrainedTokenizerFast"}
    return {"add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": tok.added_tokens_decoder(),
            "additional_special_tokens": ["<role>", "</role>", "<|arithmetic_start|>", "<|arithmetic_end|>",
                                          "<|number_start|>", "<|number_end|>"],
            "bos_token": "<|startoftext|>", "chat_template": tok.chat_template(), "clean_up_tokenization_spaces": False,
            "cls_token": "[CLS]", "eos_token": "<|endoftext|>", "fast_tokenizer": True, "gmask_token": "[gMASK]",
            "merges_file": None, "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": 1000000000000000019884624838656, "pad_token": "<|endoftext|>",
            "tokenizer_class": "PreTrainedTokenizerFast", "vocab_file": None}


def qwen2_tokenizer_config(tok):
    """Qwen2.5's tokenizer_config.json plus Dream's <|beginoftext|> (bos) and <|mask|>."""
    return {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": tok.added_tokens_decoder(),
            "additional_special_tokens": [c for c, _ in tok.kind.specials[1:14]], "bos_token": "<|beginoftext|>",
            "chat_template": tok.chat_template(), "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>",
            "errors": "replace", "mask_token": "<|mask|>", "model_max_length": 131072, "pad_token": "<|endoftext|>",
            "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}


def train_bpe(kind, texts, vocab_size):
    """Byte-level BPE trained with Hugging Face `tokenizers`, then rebuilt from our own JSON and checked to
    tokenize identically."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    hf = Tokenizer(models.BPE())
    if kind.nfc:
        hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(kind.pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    n_bpe = vocab_size - len(kind.specials)
    trainer = trainers.BpeTrainer(vocab_size=n_bpe, min_frequency=2, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(texts, trainer=trainer)
    model = json.loads(hf.to_str())["model"]
    vocab = model["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    if sorted(vocab.values()) != list(range(n_bpe)):
        raise SystemExit(f"train_tiny: BPE training gave {len(vocab)} tokens, wanted ids 0..{n_bpe - 1}")
    tok = ByteBPE(kind, vocab, merges, use_hf=True)
    sample = texts[:2000]
    if [e.ids for e in hf.encode_batch(sample)] != tok.encode_batch(sample):
        raise SystemExit(f"train_tiny: the {kind.name} tokenizer.json we write does not reproduce the trained tokenizer")
    return tok


def byte_tokenizer(kind):
    """Smoke runs: 256 byte tokens (id = byte value) and the added tokens; no merges."""
    return ByteBPE(kind, {BYTE_SYMBOL[b]: b for b in range(256)}, [], use_hf=False)


def check_tokenizer(tok, heldout_text):
    """Decoding inverts encoding (byte-level BPE is lossless after normalisation); no special-token text hides
    in the corpus, so the protocol's 'special text is plain text' cannot matter."""
    ids = tok.encode(heldout_text)
    want = unicodedata.normalize("NFC", heldout_text) if tok.kind.nfc else heldout_text
    if tok.decode(ids) != want:
        raise SystemExit(f"train_tiny: the {tok.kind.name} tokenizer does not round-trip the held-out text")
    if any(c in heldout_text for c, _ in tok.kind.specials):
        raise SystemExit("train_tiny: special-token text in the held-out text")
    return ids


# ----------------------------------------------------------------------------------------------------
# Configs in the real schemas
# ----------------------------------------------------------------------------------------------------
def model_config(r, tok):
    kind = tok.kind
    if r.family == "llada2":
        return tiny_llada2.config(r, tok.n_vocab, {"mask": tok.special(kind.mask), "eos": tok.special(kind.eos),
                                                   "bos": tok.special(kind.bos)})
    if r.family == "llada":
        cfg = dict(LLADA_CFG)
        cfg.update(d_model=r.d_model, n_heads=r.n_heads, n_kv_heads=r.n_kv_heads, n_layers=r.n_layers,
                   mlp_hidden_size=r.mlp_hidden, vocab_size=tok.n_vocab, embedding_size=tok.n_vocab,
                   max_sequence_length=r.seq_len, eos_token_id=tok.special(kind.eos), pad_token_id=tok.special(kind.eos),
                   mask_token_id=tok.special(kind.mask), residual_dropout=r.dropout, init_fn="normal", init_std=0.02)
    else:
        cfg = dict(DREAM_CFG)
        cfg.update(hidden_size=r.d_model, num_attention_heads=r.n_heads, num_key_value_heads=r.n_kv_heads,
                   num_hidden_layers=r.n_layers, max_window_layers=r.n_layers, intermediate_size=r.mlp_hidden,
                   vocab_size=tok.n_vocab, max_position_embeddings=r.seq_len, bos_token_id=tok.special(kind.bos),
                   eos_token_id=tok.special(kind.eos), pad_token_id=tok.special(kind.eos),
                   mask_token_id=tok.special(kind.mask))
    return dict(sorted(cfg.items()))


def generation_config(tok):
    kind = tok.kind
    return {"bos_token_id": tok.special(kind.bos), "eos_token_id": tok.special(kind.eos),
            "pad_token_id": tok.special(kind.eos)}


# ----------------------------------------------------------------------------------------------------
# The training model: make_fixtures.Model's function, batched, with dropout, for autograd and autocast
# ----------------------------------------------------------------------------------------------------
def rms_norm(x, w, eps):
    """HF order: normalise in float32, cast back to the activation dtype, then scale."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def attention(q, k, v):
    """Bidirectional attention over [B, H, T, hd]: no mask at all, as in LLaDA and Dream."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.float(), -1).to(v.dtype) @ v


class Block(nn.Module):
    def __init__(self, r, qkv_bias):
        super().__init__()
        d, self.head_dim = r.d_model, r.d_model // r.n_heads
        self.n_heads, self.n_kv_heads = r.n_heads, r.n_kv_heads
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.q = nn.Linear(d, r.n_heads * self.head_dim, bias=qkv_bias)
        self.k = nn.Linear(d, r.n_kv_heads * self.head_dim, bias=qkv_bias)
        self.v = nn.Linear(d, r.n_kv_heads * self.head_dim, bias=qkv_bias)
        self.o = nn.Linear(r.n_heads * self.head_dim, d, bias=False)
        self.ff_norm = nn.Parameter(torch.ones(d))
        self.gate = nn.Linear(d, r.mlp_hidden, bias=False)
        self.up = nn.Linear(d, r.mlp_hidden, bias=False)
        self.down = nn.Linear(r.mlp_hidden, d, bias=False)
        self.drop = nn.Dropout(r.dropout)

    def heads(self, x, n):
        return x.view(x.shape[0], x.shape[1], n, self.head_dim)

    def forward(self, h, cos, sin, eps):
        a = rms_norm(h, self.attn_norm, eps)
        # RoPE in float32 (LLaDA's rope_full_precision), with make_fixtures' rotate-half and tables.
        v = self.heads(self.v(a), self.n_kv_heads)
        q = rope(self.heads(self.q(a), self.n_heads).float(), cos, sin).to(v.dtype)
        k = rope(self.heads(self.k(a), self.n_kv_heads).float(), cos, sin).to(v.dtype)
        group = self.n_heads // self.n_kv_heads  # GQA: query head h reads key/value head h // group
        k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
        o = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
        h = h + self.drop(self.o(o.reshape(h.shape[0], h.shape[1], -1)))
        b = rms_norm(h, self.ff_norm, eps)
        return h + self.drop(self.down(F.silu(self.gate(b)) * self.up(b)))


class TinyDLM(nn.Module):
    def __init__(self, r, cfg):
        super().__init__()
        vocab = cfg["embedding_size"] if r.family == "llada" else cfg["vocab_size"]
        self.embed = nn.Embedding(vocab, r.d_model)
        self.blocks = nn.ModuleList(Block(r, qkv_bias=r.family == "dream") for _ in range(r.n_layers))
        self.final_norm = nn.Parameter(torch.ones(r.d_model))
        self.head = nn.Linear(r.d_model, vocab, bias=False)
        self.eps, self.shift = cfg["rms_norm_eps"], r.family == "dream"
        cos, sin = rope_tables(cfg["rope_theta"], r.d_model // r.n_heads, r.seq_len)
        self.register_buffer("cos", cos.float(), persistent=False)
        self.register_buffer("sin", sin.float(), persistent=False)

    def forward(self, ids):
        T = ids.shape[1]
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h, self.cos[:T], self.sin[:T], self.eps)
        logits = self.head(rms_norm(h, self.final_norm, self.eps))
        if self.shift:  # Dream: position i is predicted by row i-1, position 0 by row 0
            logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
        return logits


def init_weights(model, n_layers):
    """Normal(0, 0.02); the projections that write into the residual stream scaled by 1/sqrt(2 n_layers)."""
    for name, p in model.named_parameters():
        if name.endswith("norm"):
            nn.init.ones_(p)
        elif name.endswith("bias"):
            nn.init.zeros_(p)
        else:
            std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("o.weight", "down.weight")) else 0.02
            nn.init.normal_(p, 0.0, std)


TOP_LEVEL_NAMES = {"llada": ("model.transformer.wte.weight", "model.transformer.ln_f.weight", "model.transformer.ff_out.weight"),
                   "dream": ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")}


def hf_tensors(model, family, cfg):
    """The module's parameters under their Hugging Face names (per layer: make_fixtures.Model.names), checked
    against the tensor list of make_fixtures' llada_specs / dream_specs."""
    embed, final_norm, head = TOP_LEVEL_NAMES[family]
    out = {embed: model.embed.weight, final_norm: model.final_norm, head: model.head.weight}
    names = Model(family, cfg, {}).names
    for layer, b in enumerate(model.blocks):
        n = names(layer)
        out.update({n["an"]: b.attn_norm, n["q"]: b.q.weight, n["k"]: b.k.weight, n["v"]: b.v.weight, n["o"]: b.o.weight,
                    n["fn"]: b.ff_norm, n["g"]: b.gate.weight, n["u"]: b.up.weight, n["dn"]: b.down.weight})
        if "bq" in n:
            out.update({n["bq"]: b.q.bias, n["bk"]: b.k.bias, n["bv"]: b.v.bias})
    specs = (llada_specs if family == "llada" else dream_specs)(cfg)
    want = {name: tuple(shape) for name, shape, _ in specs}
    got = {name: tuple(t.shape) for name, t in out.items()}
    if got != want:
        differences = sorted(set(got.items()) ^ set(want.items()))[:4]
        raise SystemExit(f"train_tiny: tensor layout differs from the reference: {differences}")
    return out, specs


def check_against_reference(r, cfg, device):
    """Before any training: the training module, loaded with make_fixtures-style random weights, must give the
    reference forward's logits (catches a wrong name, transpose, RoPE layout or shift at no cost)."""
    model = TinyDLM(r, cfg).to(device).eval()
    params, specs = hf_tensors(model, r.family, cfg)
    _, weights = make_weights(specs, 99, lambda name, role: "F32")
    ids = torch.randint(0, params[TOP_LEVEL_NAMES[r.family][0]].shape[0], (min(48, r.seq_len),),
                        generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name])
        got = model(ids[None].to(device))[0].double().cpu()
    want = Model(r.family, cfg, weights).logits(ids.tolist())
    rel = float((got - want).abs().max() / want.abs().max())
    if not rel < 1e-2:  # a layout bug gives ~1; float32 kernels (TF32 at worst) stay far below
        raise SystemExit(f"train_tiny: {r.name}: training forward differs from the reference (relative {rel:.2e})")
    return rel


# ----------------------------------------------------------------------------------------------------
# Objective and data
# ----------------------------------------------------------------------------------------------------
def diffusion_loss(model, x0, region, mask_id, gen):
    """LLaDA's objective (GUIDELINES.md): per row t ~ U(0, 1), p = (1 - eps) t + eps; each position of `region`
    is masked with probability p; loss = sum over masked positions of CE / p, divided by the region's size.
    Pre-training: the region is every position (B * L). SFT: the region is the answer, so the prompt is never
    masked and the loss is normalised by the answer length."""
    B, L = x0.shape
    t = torch.rand(B, 1, device=x0.device, generator=gen)
    p = (1 - MASK_EPS) * t + MASK_EPS
    masked = (torch.rand(B, L, device=x0.device, generator=gen) < p) & region
    logits = model(x0.masked_fill(masked, mask_id))
    ce = F.cross_entropy(logits.float().reshape(B * L, -1), x0.reshape(-1), reduction="none").view(B, L)
    return (ce * masked / p).sum() / region.sum().clamp(min=1)


class TextBatches:
    """Rows of `seq_len` tokens cut at random offsets from the packed training stream (quotes in a seeded
    shuffled order, each followed by <|endoftext|>); 1% of batches are cut to a random length."""

    def __init__(self, stream, r, gen, seed):
        self.stream, self.r, self.gen, self.rng = stream, r, gen, random.Random(seed)
        self.offsets = torch.arange(r.seq_len, device=stream.device)

    def __call__(self):
        L = self.r.seq_len
        if self.rng.random() < TRUNCATE_FRACTION:
            L = self.rng.randint(1, self.r.seq_len)
        starts = torch.randint(0, len(self.stream) - L + 1, (self.r.batch,), device=self.stream.device, generator=self.gen)
        x0 = self.stream[starts[:, None] + self.offsets[None, :L]]
        return x0, torch.ones_like(x0, dtype=torch.bool)


def decimal_digits(x, n):
    """[B] -> [B, n] digits, most significant first, zero-padded."""
    powers = 10 ** torch.arange(n - 1, -1, -1, device=x.device)
    return (x[:, None] // powers) % 10


class Addition:
    """5-digit + 5-digit sums as LLaDA SFT pairs: prompt "a+b=" (12 tokens: the Ling regex splits digits singly),
    answer = the digits of a+b padded with <|endoftext|> to 8 tokens (the padding is trained, as LLaDA pads
    SFT answers with EOS). Problems of the test set never appear in training batches."""

    def __init__(self, tok, device, test_problems):
        self.digit = torch.tensor([tok.single_id(str(d)) for d in range(10)], device=device)
        self.plus, self.equals, self.eos = tok.single_id("+"), tok.single_id("="), tok.special("<|endoftext|>")
        self.test_codes = torch.tensor([a * 10 ** ADD_DIGITS + b for a, b in test_problems], device=device)
        self.prompt_len = 2 * ADD_DIGITS + 2
        for a, b in test_problems[:20]:  # the tensor encoding is the tokenizer's encoding
            text_ids = tok.encode(f"{a}+{b}=") + tok.encode(str(a + b))
            text_ids += [self.eos] * (ADD_SEQ_LEN - len(text_ids))
            assert self.encode(torch.tensor([a], device=device), torch.tensor([b], device=device))[0].tolist() == text_ids

    def encode(self, a, b):
        B, dev = a.shape[0], a.device
        s = a + b
        digits = self.digit[decimal_digits(s, ADD_DIGITS + 1)]
        pad = torch.full((B, ADD_ANSWER_LEN), self.eos, device=dev)
        six = torch.cat([digits, pad], 1)[:, :ADD_ANSWER_LEN]
        five = torch.cat([digits[:, 1:], pad], 1)[:, :ADD_ANSWER_LEN]
        answer = torch.where((s >= 10 ** ADD_DIGITS)[:, None], six, five)
        sign = lambda t: torch.full((B, 1), t, device=dev)  # noqa: E731
        return torch.cat([self.digit[decimal_digits(a, ADD_DIGITS)], sign(self.plus),
                          self.digit[decimal_digits(b, ADD_DIGITS)], sign(self.equals), answer], 1)

    def batch(self, n, gen):
        lo, hi = 10 ** (ADD_DIGITS - 1), 10 ** ADD_DIGITS
        a = torch.randint(lo, hi, (n,), device=gen.device, generator=gen)
        b = torch.randint(lo, hi, (n,), device=gen.device, generator=gen)
        x0 = self.encode(a, b)
        region = torch.zeros_like(x0, dtype=torch.bool)
        region[:, self.prompt_len:] = True
        region &= ~torch.isin(a * 10 ** ADD_DIGITS + b, self.test_codes.to(a.device))[:, None]
        return x0, region


def autocast(device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


class TextValidation:
    """Masked-token NLL at the protocol's ratios on the first rows of the validation stream, fixed masks."""

    def __init__(self, ids, r, mask_id, device, n_rows=32):
        n = min(n_rows, len(ids) // r.seq_len)
        x0 = torch.tensor(ids[: n * r.seq_len]).view(n, r.seq_len)
        gen = torch.Generator().manual_seed(NLL_SEED)
        self.cases = []
        for ratio in NLL_RATIOS:
            masked = torch.rand(x0.shape, generator=gen) < ratio
            self.cases.append((x0.masked_fill(masked, mask_id).to(device), x0.to(device), masked.to(device)))

    @torch.no_grad()
    def __call__(self, model, device):
        nll = []
        for xt, x0, masked in self.cases:
            with autocast(device):
                logits = model(xt)
            nll.append(F.cross_entropy(logits.float()[masked], x0[masked]).item())
        return sum(nll) / len(nll), {f"nll@{r}": round(v, 4) for r, v in zip(NLL_RATIOS, nll)}


class AdditionValidation:
    """All 8 answer tokens masked, one forward: answer cross-entropy and whole-answer accuracy."""

    def __init__(self, task, mask_id, device, n=1024):
        self.x0, self.region = task.batch(n, torch.Generator(device=device).manual_seed(4321))
        self.mask_id = mask_id

    @torch.no_grad()
    def __call__(self, model, device):
        with autocast(device):
            logits = model(self.x0.masked_fill(self.region, self.mask_id))
        ce = F.cross_entropy(logits.float()[self.region], self.x0[self.region]).item()
        right = (logits.argmax(-1) == self.x0) | ~self.region
        return ce, {"answer_ce": round(ce, 5), "one_step_exact": round(right.all(1).float().mean().item(), 4)}


# ----------------------------------------------------------------------------------------------------
# Training with a wall-clock budget
# ----------------------------------------------------------------------------------------------------
class Schedule:
    """Linear warm-up, then cosine decay to 10% of the peak over a step count fitted to the wall-clock budget:
    the steps from CALIBRATE_FROM on are timed for CALIBRATE_SHARE of the budget, and the rest of the budget is
    turned into steps at that rate. The learning rate is then a plain function of the step, so --steps N
    reruns the same schedule."""

    def __init__(self, r, device):
        self.r, self.device = r, device
        self.total = r.steps or None
        self.deadline = time.time() + 60 * r.minutes

    def lr(self, step):
        r = self.r
        if step < r.warmup:
            return r.lr * (step + 1) / r.warmup
        if self.total is None:
            return r.lr
        progress = min(1.0, (step - r.warmup) / max(1, self.total - r.warmup))
        return r.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def after_step(self, done):
        if self.total is not None:
            return
        if done == CALIBRATE_FROM:
            self.sync()
            self.t_from = time.time()
        elif done > CALIBRATE_FROM + 10 and time.time() - self.t_from >= CALIBRATE_SHARE * 60 * self.r.minutes:
            self.sync()
            rate = (done - CALIBRATE_FROM) / (time.time() - self.t_from)
            self.total = done + max(1, int(rate * (self.deadline - time.time())))

    def pause(self, seconds):
        """Validation passes do not count against the training budget."""
        self.deadline += seconds

    def finished(self, done):
        if self.r.steps:
            return done >= self.total
        overdue = time.time() > self.deadline + 3 * self.r.minutes  # 5% over: the measured rate was optimistic
        return overdue or (self.total is not None and done >= self.total)


def train(model, r, next_batch, validate, mask_id, device, log):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": r.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=r.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if device.type == "cuda" else {}))
    gen = torch.Generator(device=device).manual_seed(r.seed)
    schedule, start = Schedule(r, device), time.time()
    eval_every = 60 * r.minutes / r.n_evals
    next_eval, step, running = None, 0, torch.zeros((), device=device)
    curve, history, best = [], [], {"metric": math.inf}
    model.train()
    while not schedule.finished(step):
        for group in opt.param_groups:
            group["lr"] = schedule.lr(step)
        x0, region = next_batch()
        with autocast(device):
            loss = diffusion_loss(model, x0, region, mask_id, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if hasattr(model, "after_step"):  # LLaDA2: the experts' selection biases follow their load
            model.after_step()
        running += loss.detach()
        step += 1
        schedule.after_step(step)
        if step % r.log_every == 0:
            curve.append([step, round(running.item() / r.log_every, 4)])
            running.zero_()
            log(f"step {step}/{schedule.total or '?'}  loss {curve[-1][1]:.4f}  lr {schedule.lr(step):.2e}  "
                f"{time.time() - start:.0f} s")
        if schedule.total is not None and next_eval is None:
            next_eval = time.time() + eval_every
        if next_eval is not None and (time.time() >= next_eval or schedule.finished(step)):
            paused = time.time()
            best = validation_pass(model, validate, step, device, history, best, log)
            schedule.pause(time.time() - paused)
            next_eval = time.time() + eval_every
    if not history or history[-1]["step"] != step:
        best = validation_pass(model, validate, step, device, history, best, log)
    model.load_state_dict(best["state"])
    wall = time.time() - start
    last = curve[-1][1] if curve else round(running.item() / max(1, step % r.log_every), 4)
    return {"steps": step, "wall_time_s": round(wall, 1), "steps_per_s": round(step / wall, 2),
            "final_train_loss": last, "loss_curve": curve, "validation": history,
            "chosen_step": best["step"], "chosen_validation": best["detail"]}


def validation_pass(model, validate, step, device, history, best, log):
    """The exported weights are those of the best validation pass (early stopping on the validation split)."""
    model.eval()
    metric, detail = validate(model, device)
    model.train()
    history.append({"step": step, "metric": round(metric, 5), **detail})
    log(f"validation at step {step}: {detail}")
    if metric < best["metric"]:
        best = {"metric": metric, "step": step, "detail": detail,
                "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    return best


# ----------------------------------------------------------------------------------------------------
# Export and the reference evaluation of the exported BF16 weights
# ----------------------------------------------------------------------------------------------------
def export(model, r, cfg, tok, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    params = tiny_llada2.checked_tensors(model, cfg) if r.family == "llada2" else hf_tensors(model, r.family, cfg)[0]
    tensors = [(name, "BF16", tuple(t.shape), bf16_round(t.detach().float().cpu().numpy())[0].tobytes())
               for name, t in params.items()]
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    write_json(os.path.join(out_dir, "config.json"), cfg)
    write_json(os.path.join(out_dir, "generation_config.json"), generation_config(tok))
    tok.save(out_dir)


def read_bf16_safetensors(path):
    """{name: float64 tensor} holding exactly the BF16 values of the file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    weights = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        bits = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
        weights[name] = torch.from_numpy(bits.view(np.float32).astype(np.float64).reshape(info["shape"]))
    return weights


def masked_nll(ref, ids, mask_id):
    """NLL_PROTOCOL, on the reference forward (float64) of the exported weights."""
    if len(ids) < NLL_WINDOW * NLL_WINDOWS:
        raise SystemExit(f"train_tiny: the held-out text has {len(ids)} tokens; the protocol needs {NLL_WINDOW * NLL_WINDOWS}")
    windows = np.asarray(ids[: NLL_WINDOW * NLL_WINDOWS], dtype=np.int64).reshape(NLL_WINDOWS, NLL_WINDOW)
    nll, counts = [], []
    for step, ratio in enumerate(NLL_RATIOS):
        u = uniform(NLL_SEED, np.arange(NLL_WINDOW)[None, :], np.arange(NLL_WINDOWS)[:, None], step, NLL_STREAM)
        masked = u < ratio
        total, count = 0.0, 0
        for w in range(NLL_WINDOWS):
            pos = np.nonzero(masked[w])[0]
            logp = torch.log_softmax(ref.logits(np.where(masked[w], mask_id, windows[w]).tolist()), -1)
            total -= float(logp[torch.from_numpy(pos), torch.from_numpy(windows[w][pos])].sum())
            count += len(pos)
        nll.append(total / count)
        counts.append(count)
    ids_digest = hashlib.sha256(windows.astype("<i4").tobytes()).hexdigest()
    return {"ratios": list(NLL_RATIOS), "nll": [round(v, 6) for v in nll], "n_masked": counts,
            "windows": NLL_WINDOWS, "window_length": NLL_WINDOW, "seed": NLL_SEED, "stream": NLL_STREAM,
            "evaluated_ids_sha256": ids_digest, "protocol": NLL_PROTOCOL}


def addition_exact_match(ref, tok, problems):
    """LLaDA generate.py semantics (make_fixtures.generate): prompt "a+b=" without chat template, gen_length =
    steps = block = 8, low-confidence remasking, temperature 0; the answer ends at the first EOS/EoT."""
    eos, eot, mask = tok.special(tok.kind.eos), tok.special(tok.kind.eot), tok.special(tok.kind.mask)
    correct, failures = 0, []
    for a, b in problems:
        prompt = tok.encode(f"{a}+{b}=")
        canvas = generate(ref, prompt, ADD_ANSWER_LEN, ADD_ANSWER_LEN, ADD_ANSWER_LEN, mask_id=mask, eos_id=eos, eot_id=eot)[-1]
        answer = tok.decode(truncate(canvas[len(prompt):], eos, eot))
        if answer == str(a + b):
            correct += 1
        elif len(failures) < 10:
            failures.append(f"{a}+{b}={answer}")
    return {"problems": len(problems), "correct": correct, "exact_match": round(correct / len(problems), 4),
            "test_file": "tests/data/add_test.txt", "gen_length": ADD_ANSWER_LEN, "steps": ADD_ANSWER_LEN,
            "block_length": ADD_ANSWER_LEN, "remasking": "low_confidence", "temperature": 0, "failures": failures}


def llada2_samples(ref, tok):
    """LLaDA2.0's generate (greedy, threshold 0.95 as dllm-generate's default for LLaDA2, block 32, 32 steps):
    golden traces for dllm's LLaDA2 decoding on a trained model (build/dllm-generate --ids ... -n 32)."""
    eos, mask = tok.special(tok.kind.eos), tok.special(tok.kind.mask)
    samples = []
    for prompt in SAMPLE_PROMPTS:
        ids = tok.encode(prompt)
        out = tiny_llada2.generate(ref, ids, 32, 32, 32, 0.95, mask, eos)
        samples.append({"prompt": prompt, "prompt_ids": ids, "gen_length": 32, "steps": 32, "block_length": 32,
                        "threshold": 0.95, "decoding": "LLaDA2.0 generate, greedy", "output_ids": out,
                        "output_text": tok.decode([i for i in out if i != eos])})
    return samples


def text_samples(ref, tok):
    """Greedy generations, also golden traces for the C library's generation on a trained model."""
    eos, eot, mask = tok.special(tok.kind.eos), tok.special(tok.kind.eot), tok.special(tok.kind.mask)
    samples = []
    for prompt in SAMPLE_PROMPTS:
        ids = tok.encode(prompt)
        canvas = generate(ref, ids, 32, 32, 8, mask_id=mask, eos_id=eos, eot_id=eot)[-1]
        out = truncate(canvas[len(ids):], eos, eot)
        samples.append({"prompt": prompt, "prompt_ids": ids, "gen_length": 32, "steps": 32, "block_length": 8,
                        "remasking": "low_confidence", "temperature": 0, "generated_ids": canvas[len(ids):],
                        "output_ids": out, "output_text": tok.decode(out)})
    return samples


def transformers_check(model_dir, tok, text):
    """Where transformers is installed: its AutoTokenizer reads the exported files to the same ids, and renders
    the chat template (a fixture for dllm's chat renderer)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the device has no network: never wait on one
    try:
        import transformers
        hf = transformers.AutoTokenizer.from_pretrained(model_dir)
        ids = hf.encode(text, add_special_tokens=False)
        chat = hf.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
        return {"transformers": transformers.__version__, "class": type(hf).__name__,
                "same_ids_on_heldout": ids == tok.encode(text), "chat_user_Hi": chat,
                "chat_user_Hi_ids": hf.encode(chat, add_special_tokens=False)}
    except Exception as e:  # a cross-check only: never lose a trained model over it
        return {"error": repr(e)[:400]}


# ----------------------------------------------------------------------------------------------------
# Model cards
# ----------------------------------------------------------------------------------------------------
def write_card(out_dir, card):
    write_json(os.path.join(out_dir, "model_card.json"), card)
    write_text(os.path.join(out_dir, "README.md"), card_markdown(card))


def card_markdown(c):
    t, e, a = c["training"], c["evaluation"], c["architecture"]
    lines = [f"# {c['name']}", "", c["summary"], "",
             "Trained by `tools/train_tiny.py` in the dllm repository; `model_card.json` holds everything below and more.", "",
             "## Architecture", "",
             f"{c['family']} layout, {c['parameters']:,} parameters: d_model {a['d_model']}, {a['n_layers']} layers, "
             f"{a['n_heads']} heads / {a['n_kv_heads']} key-value heads of {a['head_dim']}, MLP {a['mlp_hidden']}, "
             f"vocabulary {a['vocab']}, context {a['context']}, weights BF16.", ""]
    if "moe" in a:
        lines += [f"Mixture of experts (LLaDA2MoeSparseMoeBlock): {json.dumps(a['moe'])}; QK-norm, partial RoPE, no "
                  "logit shift, attention block-causal at 32.", ""]
    lines += ["## Data", ""]
    d = c["data"]
    if "split_rule" in d:
        lines += [f"- Source: {d['source']}; {len(d['file_names'])} files, {d['bytes']:,} bytes, sha256 `{d['sha256']}`.",
                  f"- Split: {d['split_rule']}.",
                  f"- Quotes: {d['quotes']}. Tokens: {d['tokens']}.",
                  f"- Packing: {d['packing']}"]
    else:
        lines += [f"- Task ({d['source']}): {d['task']}"]
    lines += ["", "## Tokenizer", "", f"{c['tokenizer']['summary']}", "", "## Training", "",
              f"- Objective: {t['objective']}",
              f"- Hyper-parameters: {json.dumps(t['hyperparameters'])}",
              f"- Seed {t['seed']}; {t['steps']} steps in {t['wall_time_s']} s ({t['steps_per_s']} steps/s) "
              f"on {c['environment']['device']}.",
              f"- Final training loss (mean of the last {t['hyperparameters']['log_every']} steps): {t['final_train_loss']}.",
              f"- Exported weights: step {t['chosen_step']} (best validation pass: {t['chosen_validation']}).",
              f"- Environment: {json.dumps(c['environment'])}", "", "## Evaluation", "",
              "Computed on the exported BF16 weights, upcast exactly, with the float64 reference forward of "
              f"`tools/{'tiny_llada2' if 'moe' in a else 'make_fixtures'}.py`; dllm's CPU reference must reproduce "
              "them within 1%.", ""]
    if "masked_nll" in e:
        m = e["masked_nll"]
        lines += ["| mask ratio | masked positions | NLL (nats/token) |", "| --- | --- | --- |"]
        lines += [f"| {r} | {n} | {v:.4f} |" for r, n, v in zip(m["ratios"], m["n_masked"], m["nll"])]
        lines += ["", m["protocol"], ""]
    if "addition" in e:
        x = e["addition"]
        lines += [f"Exact match on `{x['test_file']}`: **{x['correct']}/{x['problems']} = {x['exact_match']:.2%}** "
                  f"(prompt `a+b=`, no chat template; gen_length = steps = block = {x['gen_length']}, low-confidence "
                  "remasking, temperature 0, generate.py semantics; the answer ends at the first `<|endoftext|>`).", ""]
    for s in e.get("samples", []):
        how = f"gen {s['gen_length']}, steps {s['steps']}, block {s['block_length']}"
        how += f", threshold {s['threshold']}" if "threshold" in s else ""
        lines += [f"Greedy sample ({how}): `{s['prompt']!r}` -> `{s['output_text']!r}`", ""]
    lines += ["## Reproduce", "", "```sh", c["command"], "```", ""]
    return "\n".join(lines)


def environment(device):
    env = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
           "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})"}
    try:
        import tokenizers
        env["tokenizers"] = tokenizers.__version__
    except ImportError:
        env["tokenizers"] = None
    return env


# ----------------------------------------------------------------------------------------------------
# One model, end to end
# ----------------------------------------------------------------------------------------------------
def run_recipe(r, tok, data, args, device):
    log = lambda msg: print(f"[{r.name}] {msg}", flush=True)  # noqa: E731
    cfg = model_config(r, tok)
    mask_id = cfg["mask_token_id"]
    moe = r.family == "llada2"
    reference_check = (tiny_llada2.check_against_reference if moe else check_against_reference)(r, cfg, device)
    log(f"training forward matches the reference (max relative logit difference {reference_check:.1e})")

    torch.manual_seed(r.seed)
    model = (tiny_llada2.Llada2DLM if moe else TinyDLM)(r, cfg).to(device)
    (tiny_llada2.init_weights if moe else init_weights)(model, r.n_layers)
    n_params = sum(p.numel() for p in model.parameters())
    if r.task == "text":
        stream = torch.tensor(data["train_stream"][tok.kind.name], device=device)
        next_batch = TextBatches(stream, r, torch.Generator(device=device).manual_seed(r.seed + 1000), r.seed)
        validate = TextValidation(data["validation_ids"][tok.kind.name], r, mask_id, device)
    else:
        task = Addition(tok, device, data["problems"])
        gen = torch.Generator(device=device).manual_seed(r.seed + 1000)
        next_batch = lambda: task.batch(r.batch, gen)  # noqa: E731
        validate = AdditionValidation(task, mask_id, device)
    log(f"{n_params:,} parameters; training for {r.steps or str(r.minutes) + ' min'} on {device}")
    stats = train(model, r, next_batch, validate, mask_id, device, log)

    out_dir = os.path.join(args.out, r.name)
    export(model, r, cfg, tok, out_dir)
    t0 = time.time()
    # make_fixtures' (LLaDA2: tiny_llada2's) reference forward: float64 on the CPU, as dllm's C reference runs
    # (in float32).
    weights = read_bf16_safetensors(os.path.join(out_dir, "model.safetensors"))
    ref = tiny_llada2.Reference(cfg, weights) if moe else Model(r.family, cfg, weights)
    evaluation = {"reference_check_max_rel_logit_diff": reference_check}
    if r.task == "text":
        heldout_ids = data["heldout_ids"][tok.kind.name]
        evaluation["masked_nll"] = masked_nll(ref, heldout_ids, mask_id)
        # The ids are also a golden fixture for dllm's C tokenizer, beside the model they belong to.
        ids_file = f"heldout.{r.name}.ids"
        write_text(os.path.join(args.data_out, ids_file), " ".join(map(str, heldout_ids)) + "\n")
        evaluation["masked_nll"]["heldout_ids_file"] = "tests/data/" + ids_file
        if moe:  # dllm_logits' LLaDA2 forward, which dllm-eval --nll runs
            evaluation["masked_nll"]["protocol"] = NLL_PROTOCOL.replace(
                "one full bidirectional forward", "one forward, block-causal at 32 (dllm_logits' LLaDA2 forward)")
        evaluation["samples"] = (llada2_samples if moe else text_samples)(ref, tok)
        log(f"held-out masked NLL {dict(zip(NLL_RATIOS, evaluation['masked_nll']['nll']))}")
    else:
        evaluation["addition"] = addition_exact_match(ref, tok, data["problems"][: args.add_eval])
        log(f"exact match {evaluation['addition']['correct']}/{evaluation['addition']['problems']}")
    if not args.smoke:
        evaluation["tokenizer_files_check"] = transformers_check(out_dir, tok, data["heldout_text"])
    evaluation["eval_wall_time_s"] = round(time.time() - t0, 1)
    write_card(out_dir, model_card(r, cfg, tok, data, stats, evaluation, n_params, device))
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    return {"name": r.name, "family": r.family, "parameters": n_params, "bytes": size, "steps": stats["steps"],
            "loss": stats["final_train_loss"], "evaluation": evaluation}


def model_card(r, cfg, tok, data, stats, evaluation, n_params, device):
    corpus = data["corpus"]
    if r.task == "text":
        layout = {"llada": "LLaDA", "dream": "Dream", "llada2": "LLaDA2 (mixture-of-experts)"}[r.family]
        summary = (f"A tiny {layout}-layout masked-diffusion language model trained from scratch on the quotes of "
                   "Debian's fortunes package, for testing dllm.")
        d = {"source": FORTUNES_SOURCE, "file_names": corpus["files"], "bytes": corpus["bytes"], "sha256": corpus["sha256"],
             "split_rule": SPLIT_RULE, "quotes": data["quote_counts"],
             "tokens": data["token_counts"][tok.kind.name],
             "packing": ("training quotes in a seeded shuffled order (random.Random(0)), each followed by "
                         "<|endoftext|>, concatenated; every batch takes rows of "
                         f"{r.seq_len} tokens at uniform random offsets; 1% of batches cut to a random length.")}
        objective = ("LLaDA masked-diffusion pre-training: t ~ U(0,1) per row, p = (1-1e-3) t + 1e-3, every token "
                     "masked with probability p, loss = sum of masked CE / p / (B*L)"
                     + ("; Dream's logit shift (row i-1 predicts token i, row 0 predicts token 0)"
                        if r.family == "dream" else "")
                     + ("; attention block-causal at 32 as in LLaDA2's forward (dllm_logits and generate); expert "
                        "selection biases moved 1e-3 a step towards equal load (auxiliary-loss-free balancing)"
                        if r.family == "llada2" else ""))
    else:
        summary = ("A tiny LLaDA-layout model fine-tuned SFT-style on 5-digit + 5-digit addition, for an exact-match "
                   "test of dllm.")
        d = {"source": "synthetic",
             "task": (f"a, b uniform in [10000, 99999]; prompt 'a+b=' ({2 * ADD_DIGITS + 2} tokens), answer the digits of "
                      f"a+b padded with <|endoftext|> to {ADD_ANSWER_LEN} tokens; the {ADD_TEST_N} problems of "
                      f"tests/data/add_test.txt (random.Random({ADD_TEST_SEED})) are excluded from training.")}
        objective = ("LLaDA SFT: the prompt is never masked; answer tokens (EOS padding included) masked with "
                     "p = (1-1e-3) t + 1e-3, t ~ U(0,1) per row; loss = sum of masked CE / p / (B * answer length)")
    hyper = {k: v for k, v in dataclasses.asdict(r).items() if k not in ("name", "family", "task", "seed")}
    hyper.update(optimizer="AdamW(betas=(0.9, 0.95), eps=1e-8), no decay on 1-D tensors", grad_clip=1.0,
                 schedule=f"linear warm-up {r.warmup} steps, cosine to 10% at the last step",
                 precision="bf16 autocast, fp32 master weights" if device.type == "cuda" else "fp32",
                 init="normal(0, 0.02), residual output projections / sqrt(2 n_layers)",
                 checkpoint_choice="the best validation pass")
    arch = {"d_model": r.d_model, "n_layers": r.n_layers, "n_heads": r.n_heads, "n_kv_heads": r.n_kv_heads,
            "head_dim": r.d_model // r.n_heads, "mlp_hidden": r.mlp_hidden, "vocab": tok.n_vocab,
            "context": r.seq_len, "mask_token_id": cfg["mask_token_id"], "logit_shift": r.family == "dream"}
    if r.family == "llada2":
        arch["moe"] = {k: cfg[k] for k in ("first_k_dense_replace", "num_experts", "num_experts_per_tok", "n_group",
                                           "topk_group", "moe_intermediate_size", "num_shared_experts",
                                           "routed_scaling_factor", "rotary_dim", "rope_theta")}
    return {
        "name": r.name, "family": r.family, "summary": summary, "parameters": n_params,
        "architecture": arch,
        "data": d,
        "tokenizer": dict(tok.describe(), summary=tokenizer_summary(tok)),
        "training": dict(objective=objective, hyperparameters=hyper, seed=r.seed, **stats),
        "evaluation": evaluation, "environment": environment(device), "command": data["command"],
    }


def tokenizer_summary(tok):
    k = tok.kind
    files = ("tokenizer.json (LLaDA's layout)" if k is not QWEN2 else
             "vocab.json + merges.txt + tokenizer_config.json (Dream's layout)")
    return (f"Byte-level BPE, {len(tok.vocab)} BPE tokens ({len(tok.merges)} merges) then {len(tok.added)} added tokens "
            f"(ids {len(tok.vocab)}..{tok.n_vocab - 1}); {'Qwen2' if k is QWEN2 else 'Ling/LLaDA'} split regex `{k.pattern}`; "
            f"normalizer {'NFC' if k.nfc else 'none'}; files {files}; bos {k.bos}, eos {k.eos}, end of turn {k.eot}, "
            f"mask {k.mask} = {tok.special(k.mask)}; trained on the training split only.")


# ----------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------
def parse_args():
    p = argparse.ArgumentParser(description="Train dllm's tiny diffusion LMs (see the header comment).")
    p.add_argument("--fortunes", default=".carry/fortunes", help="folder with the fortunes text files")
    p.add_argument("--out", help="model directories go here (default models, smoke: build/smoke/models)")
    p.add_argument("--data-out", help="heldout.txt and add_test.txt go here (default tests/data, smoke: build/smoke/tests/data)")
    p.add_argument("--only", nargs="+", choices=[r.name for r in RECIPES], help="train only these models")
    # Per recipe in RECIPES order (tiny-llada, tiny-dream, tiny-add, tiny-llada2); three values leave the fourth
    # at its default, so older command lines keep working.
    p.add_argument("--minutes", nargs="+", type=float, metavar="M", help="training budgets, in RECIPES order")
    p.add_argument("--steps", nargs="+", type=int, metavar="N", help="fixed step counts instead, in RECIPES order")
    p.add_argument("--vocab", type=int, default=4096,
                   help="tokenizer size, added tokens included (a recipe's own vocab wins)")
    p.add_argument("--add-eval", type=int, help="addition problems to evaluate (default 500, smoke 40)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--smoke", action="store_true", help="CPU pipeline check: tiny dims, byte vocabularies, 12 s per model")
    p.add_argument("--test-data-only", action="store_true", help="write heldout.txt and add_test.txt, then stop")
    args = p.parse_args()
    args.out = args.out or ("build/smoke/models" if args.smoke else "models")
    args.data_out = args.data_out or ("build/smoke/tests/data" if args.smoke else "tests/data")
    args.add_eval = args.add_eval or (40 if args.smoke else ADD_TEST_N)
    for name in ("minutes", "steps"):
        if getattr(args, name) and not 3 <= len(getattr(args, name)) <= len(RECIPES):
            p.error(f"--{name} takes 3 or {len(RECIPES)} values (RECIPES order)")
    return args


def recipes_for(args):
    chosen = []
    for i, r in enumerate(RECIPES):
        r = smoke_recipe(r) if args.smoke else r
        if args.minutes and i < len(args.minutes):
            r = dataclasses.replace(r, minutes=args.minutes[i])
        if args.steps and i < len(args.steps):
            r = dataclasses.replace(r, steps=args.steps[i])
        if not args.only or r.name in args.only:
            chosen.append(r)
    return chosen


def write_test_data(args):
    """heldout.txt and add_test.txt: functions of the corpus and fixed seeds only, the same on every machine."""
    quotes, corpus = read_quotes(args.fortunes)
    parts = split_quotes(quotes)
    heldout_text = fortune_file_text(parts["heldout"])
    problems = addition_problems(ADD_TEST_N, ADD_TEST_SEED)
    write_text(os.path.join(args.data_out, "heldout.txt"), heldout_text)
    write_text(os.path.join(args.data_out, "add_test.txt"), "".join(f"{a}+{b}={a + b}\n" for a, b in problems))
    return corpus, parts, heldout_text, problems


def tokenizer_kind(r):
    return {"llada": LING, "dream": QWEN2, "llada2": LING2}[r.family]


def prepare_data(args, command, kinds):
    """Corpus, split, test files, the tokenizers of `kinds` and every token stream the runs need."""
    corpus, parts, heldout_text, problems = write_test_data(args)
    data = {"corpus": corpus, "problems": problems, "heldout_text": heldout_text, "command": command,
            "quote_counts": {k: len(v) for k, v in parts.items()}, "tokenizers": {},
            "train_stream": {}, "validation_ids": {}, "heldout_ids": {}, "token_counts": {}}
    for kind in kinds:
        t0 = time.time()
        vocab = next((r.vocab for r in RECIPES if tokenizer_kind(r) is kind and r.vocab), args.vocab)
        tok = byte_tokenizer(kind) if args.smoke else train_bpe(kind, parts["train"], vocab)
        heldout_ids = check_tokenizer(tok, heldout_text)
        order = list(parts["train"])
        random.Random(0).shuffle(order)
        eos = tok.special(kind.eos)
        stream = [i for ids in tok.encode_batch(order) for i in ids + [eos]]
        validation = [i for ids in tok.encode_batch(parts["validation"]) for i in ids + [eos]]
        data["tokenizers"][kind.name] = tok
        data["train_stream"][kind.name], data["validation_ids"][kind.name] = stream, validation
        data["heldout_ids"][kind.name] = heldout_ids
        data["token_counts"][kind.name] = {"train": len(stream), "validation": len(validation), "heldout": len(heldout_ids)}
        print(f"[tokenizer {kind.name}] {tok.n_vocab} ids; tokens {data['token_counts'][kind.name]}; "
              f"{time.time() - t0:.1f} s", flush=True)
    return data


def dllm_generate_ids(exe, model_dir, ids, decode):
    """build/dllm-generate on the CPU backend: (generated ids or None, its output)."""
    cmd = [exe, "-m", model_dir, "--ids", " ".join(map(str, ids))] + decode + ["--backend", "cpu", "--print-ids"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    lines = [l for l in res.stdout.splitlines() if l.startswith("ids:")]
    out = [int(t) for t in lines[-1].split()[1:]] if res.returncode == 0 and lines else None
    return out, f"{res.stdout.strip()} {res.stderr.strip()}"


def c_library_smoke(out_dir, results):
    """Smoke runs: each exported directory must load and decode in dllm's C library (ids in, ids out). LLaDA2
    takes its own decoding options (its block counts from position 0; --steps is not accepted there), and its
    greedy samples must come out of dllm as the float64 reference decoded them (a near-tie could differ: warned)."""
    exe = os.path.join("build", "dllm-generate")
    if not os.path.exists(exe):
        print("[c-check] build/dllm-generate not built: run ./build.sh first to check the exports with dllm", flush=True)
        return
    for x in results:
        name, llada2 = x["name"], x["family"] == "llada2"
        decode = ["-n", "32", "--block", "32"] if llada2 else ["-n", "16", "--steps", "16", "--block", "8"]
        ids, text = dllm_generate_ids(exe, os.path.join(out_dir, name), [1, 2, 3], decode)
        print(f"[c-check] {name}: {'ok' if ids is not None else 'FAILED'} {text}", flush=True)
        if ids is None:
            raise SystemExit(f"train_tiny: dllm cannot load or decode {name}")
        for s in x["evaluation"].get("samples", []) if llada2 else []:
            got, _ = dllm_generate_ids(exe, os.path.join(out_dir, name), s["prompt_ids"],
                                       decode + ["--threshold", str(s["threshold"])])
            verdict = "matches the reference" if got == s["output_ids"] else f"DIFFERS: {got} vs {s['output_ids']}"
            print(f"[c-check] {name} sample {s['prompt'][:24]!r}: dllm {verdict}", flush=True)


def main():
    args = parse_args()
    command = "python3 " + " ".join([os.path.relpath(__file__)] + sys.argv[1:])
    t_start = time.time()
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    want_cuda = args.device == "cuda" or (args.device == "auto" and not args.smoke and torch.cuda.is_available())
    device = torch.device("cuda" if want_cuda else "cpu")
    if args.test_data_only:
        write_test_data(args)
        return
    print(f"train_tiny: torch {torch.__version__} on {device}; out {args.out}, data {args.data_out}", flush=True)
    recipes = recipes_for(args)
    kinds = [k for k in (LING, QWEN2, LING2) if any(tokenizer_kind(r) is k for r in recipes)]
    data = prepare_data(args, command, kinds)
    results = []
    for r in recipes:
        tok = data["tokenizers"][tokenizer_kind(r).name]
        results.append(run_recipe(r, tok, data, args, device))
    total_bytes = sum(x["bytes"] for x in results)
    print(f"\ntrain_tiny: done in {time.time() - t_start:.0f} s; model.safetensors total {total_bytes / 1e6:.1f} MB")
    for x in results:
        e = x["evaluation"]
        metric = (f"NLL {e['masked_nll']['nll']}" if "masked_nll" in e else
                  f"exact match {e['addition']['exact_match']:.2%}")
        print(f"  {x['name']:11s} {x['parameters']:>10,} params  {x['bytes'] / 1e6:5.1f} MB  {x['steps']:>6} steps  "
              f"loss {x['loss']}  {metric}")
    if total_bytes > 34e6:
        print("train_tiny: WARNING: the checkpoints exceed the 34 MB budget")
    if args.smoke:
        c_library_smoke(args.out, results)


if __name__ == "__main__":
    main()
