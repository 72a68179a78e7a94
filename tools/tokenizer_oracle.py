#!/usr/bin/env python3
"""tokenizer_oracle.py - expected token ids and chat renders for dllm's tokenizer tests.

The C tests (tests/test_tokenizer.inl) compare dllm's tokenizer byte for byte with these fixtures, so CI
needs neither Python nor Hugging Face. Run from the repository root, on a machine with tokenizers 0.23
and transformers 5 (the GPU machine; about 10 s):

    python3 tools/tokenizer_oracle.py

It needs, inside the checkout: .carry/fortunes/ (Debian fortunes text, carried to the GPU machine) and
tests/data/tokenizer/qwen2.5/ (committed packed as qwen2.5.tar.xz; any ./build.sh command unpacks it) and
tests/data/tokenizer/ling/tokenizer_config.json (committed). It
  1. trains a small byte-level BPE (vocabulary 2000) on the fortunes with the Ling/LLaDA split pattern,
     puts LLaDA's 269 special tokens at their real ids (126080..126348, from LLaDA-8B-Instruct's
     tokenizer_config.json, kept beside it with the chat template) and writes ling/tokenizer.json;
  2. loads the Qwen2.5 files as Dream and Fast-dLLM v2 ship them (vocab.json + merges.txt +
     tokenizer_config.json), once through transformers' AutoTokenizer and once as a tokenizers pipeline
     built by hand, and checks that both agree;
  3. writes the ids of every corpus case (special tokens parsed and not), their decodes, and the chat
     renders of apply_chat_template to tests/data/tokenizer/{qwen2.5,ling}.expected.json.

    python3 tools/tokenizer_oracle.py --provisional

does the same without Hugging Face, for machines that lack it: it trains its own BPE, splits with the
`regex` module and merges like the slow GPT-2 tokenizer, and renders with jinja2 as transformers does.
Its fixtures say "source": "provisional ..." and must be regenerated with the command above.
"""
import collections
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")
QWEN_DIR = os.path.join(DATA, "qwen2.5")
LING_DIR = os.path.join(DATA, "ling")
FORTUNES = os.path.join(ROOT, ".carry", "fortunes")

LING_REGEX = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
QWEN_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LING_VOCAB = 2000

# Each case is bytes; the tokenizers see bytes.decode("utf-8", errors="replace"), as dllm does.
CASES = [
    ("prose", b"The quick brown fox jumps over the lazy dog."),
    ("hello", b"Hello world"),
    ("hello with space", b" Hello world"),
    ("python", b'def f(x):\n    return {"a": [1, 2, 3]}  # comment\n'),
    ("c with crlf", b'int main(void) {\n\tprintf("%d\\n", 42);\r\n\treturn 0;\r\n}\r\n'),
    ("digits", b"1234567890 3.14159 007 1,000,000 123456789012345678901234567890"),
    ("long digits", b"9" * 100),
    ("whitespace runs", b"a  b   c    d\t\te \t \tf   "),
    ("newlines", b"line1\nline2\n\nline3\r\nline4\r\n\r\n  \n  indented\n\n\n"),
    ("trailing spaces", b"ends with spaces   "),
    ("only spaces", b"     "),
    ("only newlines", b"\n\n\n"),
    ("space newline mix", b" \n \n\t\n x \r\n\r\n y\n \t "),
    ("contractions", b"I'm sure it's John's; they'll say we've done what I'd do, you're right, don't."),
    ("contractions upper", b"IT'S JOHN'S; THEY'LL SAY WE'VE, YOU'RE, I'D, I'M, DON'T 'S 'T 'LL 'Ll 'lL 'Re 'vE"),
    ("apostrophes", b"'hello' ''s '  's rock'n'roll 'x 'sd"),
    ("long s", "'\u017f and '\u017ft, it'\u017f".encode()),
    ("accents precomposed", "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m \u00fcber".encode()),
    ("accents decomposed", "cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030angstro\u0308m u\u0308ber".encode()),
    ("combining order", "a\u0323\u0307 a\u0307\u0323 q\u0307\u0323 \u1e0b\u0323 \u0301start".encode()),
    ("composition exclusions", "\u0958 \u2126 \u212b \u0344 e\u0301\u0301".encode()),
    ("hangul", "\ud55c\uad6d\uc5b4 \u1112\u1161\u11ab\u1100\u116e\u11a8 \u1100\u1161".encode()),
    ("cjk", "你好，世界！这是一个测试。日本語のテキスト、カタカナ。".encode()),
    ("emoji", "I \u2764\ufe0f \U0001f355! \U0001f44d\U0001f3fd \U0001f1eb\U0001f1f7 "
              "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family \U0001f3f3\ufe0f\u200d\U0001f308".encode()),
    ("scripts", "Ελληνικά Русский текст العربية עברית हिन्दी ไทย".encode()),
    ("unicode numbers", "\u0663\u0664\u0665 \u2460\u2461\u2462 \u216b \u00bd \u00b9\u00b2\u00b3 \uff14\uff15\uff16".encode()),
    ("qwen special tokens", b"<|im_start|>user\nHi<|im_end|>\n<|endoftext|>text<|im_end|><tool_call>x</tool_call>|<MASK>|"),
    ("llada special tokens", b"<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|mdm_mask|><|mdm_mask|>[CLS] <role>x</role>"),
    ("partial special tokens", b"<|im_start <|eot_id| <|mdm_mask|| <<|eot_id|>> <|im_end|>>"),
    ("special tokens in prose", b"The model ends a turn with <|eot_id|> or <|im_end|>, masks with <|mdm_mask|>."),
    ("invalid utf8", b"bad \xff\xfe bytes \xc3\x28 \xe2\x82 trunc \xf0\x9f\x98 end \xed\xa0\x80 surrogate \xc0\xaf overlong \x80"),
    ("control chars", b"tab\there\x00nul\x01\x1b[31mred\x7f del\x0b\x0c\x1c\x1f"),
    ("unicode spaces", "a\u00a0b\u2003c\u3000d\u2028e\u0085f\u200bg\u202f h\u1680".encode()),
    ("punctuation runs", b"!!! ??? ... --- *** ((( ))) \"\"\" ''' ;;; :::\n!!!\n\n"),
    ("url and mail", b"https://example.com/path?q=1&r=two#frag user@example.org"),
    ("mixed", "Price: $1,234.56 (\u20ac99) \u2013 50% off! \u00abquote\u00bb".encode()),
    ("long word", b"a" * 300),
    ("empty", b""),
]

CHATS = [
    ([("user", "Hi")], True),
    ([("system", "You are terse."), ("user", "  What is 2+2?  \n")], True),
    ([("user", "Hello"), ("assistant", " Hi there! "), ("user", "Tell me a joke.")], True),
    ([("user", "Hello"), ("assistant", "Hi")], False),
    ([("user", "x"), ("system", "late system"), ("user", "y")], True),
    ([("user", "\t\u3000 padded \u00a0\n\x1c")], True),
]


def fortune_lines(limit):
    """Every 97th distinct line of the fortunes (prose for the corpus), and all of the text for training."""
    texts = []
    for path in sorted(glob.glob(os.path.join(FORTUNES, "*"))):
        if os.path.isfile(path) and not path.endswith(".dat"):
            with open(path, "rb") as f:
                texts.append(f.read().decode("utf-8", errors="replace"))
    if not texts:
        sys.exit("no fortunes in %s (carry .carry/fortunes)" % FORTUNES)
    lines = [l for t in texts for l in t.split("\n") if len(l.strip()) > 20 and l.strip() != "%"]
    return texts, [("fortune %d" % i, l.encode()) for i, l in enumerate(lines[::97][:limit])]


def llada_added_tokens():
    with open(os.path.join(LING_DIR, "tokenizer_config.json"), encoding="utf-8") as f:
        dec = json.load(f)["added_tokens_decoder"]
    return sorted((int(i), t) for i, t in dec.items())


def with_llada_specials(tok_json):
    """tokenizer.json with LLaDA's special tokens at their real ids, in the vocabulary and as added tokens."""
    specials = llada_added_tokens()
    for i, t in specials:
        tok_json["model"]["vocab"][t["content"]] = i
    tok_json["added_tokens"] = [dict(id=i, content=t["content"], single_word=t["single_word"], lstrip=t["lstrip"],
                                     rstrip=t["rstrip"], normalized=t["normalized"], special=t["special"]) for i, t in specials]
    return tok_json


def bytes_to_unicode():
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the other 68 for U+0100.. (also used by
    tools/serve_bench.py and tools/train_tiny.py)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


# ---- Hugging Face (the real oracle) -----------------------------------------------------------------

def hf_train_ling(texts):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LING_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=LING_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return json.loads(tok.to_str())


def hf_oracle(tok_dir, chat_tokenizer):
    """encode/decode functions from tokenizers, checked against transformers' AutoTokenizer."""
    from transformers import AutoTokenizer
    auto = AutoTokenizer.from_pretrained(tok_dir)
    backend = auto.backend_tokenizer if hasattr(auto, "backend_tokenizer") else auto._tokenizer

    def encode(text, parse_special):
        backend.encode_special_tokens = not parse_special
        ids = backend.encode(text, add_special_tokens=False).ids
        backend.encode_special_tokens = False
        return ids

    def decode(ids, skip):
        return backend.decode(ids, skip_special_tokens=skip)

    def render(messages, add_generation_prompt):
        return chat_tokenizer(auto).apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return encode, decode, render, auto


def hf_qwen2_pipeline(d):
    """The Qwen2 pipeline as transformers 5 builds it for Qwen2Tokenizer, from the raw files of directory d (NFC, the
    Qwen2 split, byte-level BPE, the added tokens of tokenizer_config.json at their ids). tools/tokenizer_diff.py
    fuzzes dllm against it too."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    tok = Tokenizer(models.BPE.from_file(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt")))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
        dec = json.load(f).get("added_tokens_decoder", {})
    for i, t in sorted((int(i), t) for i, t in dec.items()):
        added = AddedToken(t["content"], special=t["special"], normalized=t["normalized"], lstrip=t["lstrip"], rstrip=t["rstrip"],
                           single_word=t["single_word"])
        (tok.add_special_tokens if t["special"] else tok.add_tokens)([added])
        assert tok.token_to_id(t["content"]) == i, (t["content"], i)
    return tok


# ---- Provisional oracle (no Hugging Face): regex module + slow BPE + jinja2 ----------------------------

class SlowBPE:
    """The slow GPT-2/Qwen2 tokenizer's algorithm over a tokenizer.json-like vocabulary and merges."""

    def __init__(self, vocab, merges, added, regex_text, nfc):
        import regex
        self.vocab, self.added, self.nfc = vocab, added, nfc
        self.ranks = {tuple(m): i for i, m in enumerate(merges)}
        self.by_rank = {r: p for p, r in self.ranks.items()}
        self.pat = regex.compile(regex_text)
        self.b2u = bytes_to_unicode()
        self.u2b = {c: b for b, c in self.b2u.items()}
        self.id_to_token = {i: t for t, i in vocab.items()}
        for t in added:
            self.id_to_token[t["id"]] = t["content"]

    def bpe(self, word):
        word = list(word)
        while len(word) > 1:
            pairs = [(self.ranks.get(p, 1 << 60), i) for i, p in enumerate(zip(word, word[1:]))]
            rank, _ = min(pairs)
            if rank == 1 << 60:
                break
            first, second = self.by_rank[rank]
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == first and word[i + 1] == second:
                    out.append(first + second)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            word = out
        return word

    def encode_plain(self, text):
        import unicodedata
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        ids = []
        for piece in self.pat.findall(text):
            mapped = "".join(self.b2u[b] for b in piece.encode("utf-8"))
            ids += [self.vocab[t] for t in self.bpe(mapped)]
        return ids

    def encode(self, text, parse_special):
        tokens = sorted(self.added, key=lambda t: -len(t["content"]))
        ids, done, pos = [], 0, 0
        while pos < len(text):
            hit = next((t for t in tokens if text.startswith(t["content"], pos)), None)
            if not hit:
                pos += 1
                continue
            end = pos + len(hit["content"])
            if hit["special"] and not parse_special:
                pos = end
                continue
            ids += self.encode_plain(text[done:pos]) + [hit["id"]]
            done = pos = end
        return ids + self.encode_plain(text[done:])

    def decode(self, ids, skip):
        special = {t["id"] for t in self.added if t["special"]}
        out = b""
        for i in ids:
            if skip and i in special:
                continue
            tok = self.id_to_token[i]
            out += bytes(self.u2b[c] for c in tok) if all(c in self.u2b for c in tok) else tok.encode()
        return out.decode("utf-8", errors="replace")


def provisional_train_ling(texts):
    """A plain byte-level BPE trainer (most frequent pair, ties to the smallest pair) over Ling pre-tokens."""
    import regex
    pat, b2u = regex.compile(LING_REGEX), bytes_to_unicode()
    words = collections.Counter("".join(b2u[b] for b in p.encode()) for t in texts for p in pat.findall(t))
    alphabet = sorted(set(b2u.values()))
    vocab = {c: i for i, c in enumerate(alphabet)}
    seqs = [(list(w), n) for w, n in words.items()]
    merges = []
    while len(vocab) < LING_VOCAB:
        counts = collections.Counter()
        for s, n in seqs:
            for p in zip(s, s[1:]):
                counts[p] += n
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(list(best))
        vocab.setdefault(best[0] + best[1], len(vocab))
        for s, _ in seqs:
            i = 0
            while i + 1 < len(s):
                if s[i] == best[0] and s[i + 1] == best[1]:
                    s[i:i + 2] = [best[0] + best[1]]
                i += 1
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LING_REGEX}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": merges}}


def jinja_render(template, special_map):
    """Renders like transformers' apply_chat_template (sandboxed jinja2, trim_blocks, lstrip_blocks)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    compiled = env.from_string(template)
    return lambda messages, agp: compiled.render(messages=messages, add_generation_prompt=agp, tools=None, **special_map)


def provisional_oracle(tok_dir, tok_json_or_none):
    with open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if tok_json_or_none:  # Ling: tokenizer.json
        m = tok_json_or_none["model"]
        vocab = {t: i for t, i in m["vocab"].items()}
        bpe = SlowBPE(vocab, m["merges"], tok_json_or_none["added_tokens"], LING_REGEX, nfc=False)
        template = config["chat_template"]
    else:  # Qwen2.5: vocab.json + merges.txt
        with open(os.path.join(tok_dir, "vocab.json"), encoding="utf-8") as f:
            vocab = json.load(f)
        with open(os.path.join(tok_dir, "merges.txt"), encoding="utf-8") as f:
            merges = [l.rstrip("\n").split(" ") for l in f if l.strip() and not l.startswith("#version")]
        added = [dict(id=int(i), **t) for i, t in config["added_tokens_decoder"].items()]
        bpe = SlowBPE(vocab, merges, added, QWEN_REGEX, nfc=True)
        with open(os.path.join(tok_dir, "chat_template.jinja"), encoding="utf-8") as f:
            template = f.read()
    specials = {k: (v["content"] if isinstance(v, dict) else v) for k, v in config.items() if k.endswith("_token")}
    return bpe.encode, bpe.decode, jinja_render(template, specials)


# ---- Fixtures -------------------------------------------------------------------------------------

def expected(encode, decode, render, cases, source, tokenizer_dir):
    out = {"source": source, "tokenizer": os.path.relpath(tokenizer_dir, ROOT), "cases": [], "chats": []}
    for name, raw in cases:
        text = raw.decode("utf-8", errors="replace")
        ids, plain = encode(text, True), encode(text, False)
        out["cases"].append({"name": name, "hex": raw.hex(), "ids": ids, "ids_no_parse_special": plain,
                             "decoded_hex": decode(ids, False).encode().hex(), "decoded_skip_special_hex": decode(ids, True).encode().hex()})
    for msgs, agp in CHATS:
        messages = [{"role": r, "content": c} for r, c in msgs]
        out["chats"].append({"messages": messages, "add_generation_prompt": agp, "text": render(messages, agp)})
    return out


def write_json(path, obj, compact=False):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=None if compact else 1, separators=(",", ":") if compact else None)
        f.write("\n")


def main():
    provisional = "--provisional" in sys.argv[1:]
    texts, fortunes = fortune_lines(40)
    cases = CASES + fortunes
    if provisional:
        ling_json = with_llada_specials(provisional_train_ling(texts))
        q_enc, q_dec, q_chat = provisional_oracle(QWEN_DIR, None)
        l_enc, l_dec, l_chat = provisional_oracle(LING_DIR, ling_json)
        source = "provisional: tools/tokenizer_oracle.py --provisional (Python regex + slow BPE + jinja2); regenerate with HF"
    else:
        import tokenizers
        import transformers
        ling_json = with_llada_specials(hf_train_ling(texts))
        write_json(os.path.join(LING_DIR, "tokenizer.json"), ling_json, compact=True)
        tokenizers.Tokenizer.from_file(os.path.join(LING_DIR, "tokenizer.json"))  # loads back
        q_enc, q_dec, q_chat, q_auto = hf_oracle(QWEN_DIR, lambda auto: auto)
        l_enc, l_dec, l_chat, l_auto = hf_oracle(LING_DIR, lambda auto: auto)
        assert l_auto.convert_tokens_to_ids("<|mdm_mask|>") == 126336 and l_enc("<|mdm_mask|>", True) == [126336]
        by_hand = hf_qwen2_pipeline(QWEN_DIR)
        for name, raw in cases:  # AutoTokenizer and the hand-built pipeline must agree
            text = raw.decode("utf-8", errors="replace")
            assert by_hand.encode(text, add_special_tokens=False).ids == q_enc(text, True), name
            assert q_auto(text, add_special_tokens=False)["input_ids"] == q_enc(text, True), name
            by_hand.encode_special_tokens = True
            assert by_hand.encode(text, add_special_tokens=False).ids == q_enc(text, False), name
            by_hand.encode_special_tokens = False
        source = "tokenizers %s, transformers %s" % (tokenizers.__version__, transformers.__version__)
    if provisional:
        write_json(os.path.join(LING_DIR, "tokenizer.json"), ling_json, compact=True)
    write_json(os.path.join(DATA, "qwen2.5.expected.json"), expected(q_enc, q_dec, q_chat, cases, source, QWEN_DIR))
    write_json(os.path.join(DATA, "ling.expected.json"), expected(l_enc, l_dec, l_chat, cases, source, LING_DIR))
    print("wrote %s/{qwen2.5,ling}.expected.json and ling/tokenizer.json (%s)" % (os.path.relpath(DATA, ROOT), source))


if __name__ == "__main__":
    main()
