"""Tokenizer: Hugging Face byte-level BPE and chat templates (dllm_tokenizer_*)."""
import ctypes
import os
from ctypes import byref, c_int, c_size_t, c_void_p

from . import _types as T
from ._capi import NativeHandle, check, id_array, lib, to_str


def _retrying(call, first_capacity):
    """Runs call(capacity) -> (status, needed) once more with the capacity the library asked for if too small."""
    status, needed = call(first_capacity)
    if status == T.Status.ERR_BUFFER_TOO_SMALL:
        status, needed = call(needed)
    check(status)
    return needed


class Tokenizer(NativeHandle):
    _kind, _free_name = "tokenizer", "dllm_tokenizer_free"

    def __init__(self, path):
        """Loads tokenizer.json, or vocab.json + merges.txt, from the model directory `path`."""
        out = c_void_p()
        check(lib().dllm_tokenizer_load(os.fsencode(path), byref(out)))
        self._adopt(out.value)

    @property
    def n_vocab(self):
        """One more than the largest id the tokenizer produces."""
        return lib().dllm_tokenizer_n_vocab(self._handle())

    @property
    def chat_template(self):
        return T.ChatTemplate(lib().dllm_tokenizer_chat_template(self._handle()))

    def token_id(self, token):
        """The id of a token spelled exactly as in the vocabulary (e.g. "<|mdm_mask|>"), or None."""
        tid = lib().dllm_tokenizer_token_id(self._handle(), token.encode("utf-8"))
        return None if tid < 0 else tid

    def check_model(self, model):
        """Raises DllmError unless every id this tokenizer produces is inside the model's vocabulary."""
        check(lib().dllm_tokenizer_check_model(self._handle(), model._handle()))

    def encode(self, text, parse_special=True):
        """Token ids of a string (no BOS/EOS added). parse_special=False keeps special-token text plain."""
        raw = text.encode("utf-8")
        ids = None

        def call(capacity):
            nonlocal ids
            ids, n = (ctypes.c_int32 * capacity)(), c_int()
            status = lib().dllm_tokenize(self._handle(), raw, len(raw), int(parse_special), ids, capacity, byref(n))
            return status, n.value

        n = _retrying(call, len(raw) + 1)
        return list(ids[:n])

    def decode(self, ids, skip_special=True):
        """The text of token ids; skip_special omits special tokens (as dllm-generate prints answers)."""
        arr = id_array(ids)
        buf = None

        def call(capacity):
            nonlocal buf
            buf, n = ctypes.create_string_buffer(capacity), c_size_t()
            status = lib().dllm_detokenize(self._handle(), arr, len(arr), int(skip_special), buf, capacity, byref(n))
            return status, n.value

        _retrying(call, 8 * len(arr) + 1)
        return to_str(buf.value)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        """Renders [{"role": ..., "content": ...}, ...] as transformers' apply_chat_template does; with
        tokenize=True returns the ids (special tokens parsed, as dllm-generate -p does)."""
        pairs = [(m["role"], m["content"]) if isinstance(m, dict) else tuple(m) for m in messages]
        msgs = (T.ChatMessage * len(pairs))(*[T.ChatMessage(r.encode("utf-8"), c.encode("utf-8")) for r, c in pairs])
        buf = None

        def call(capacity):
            nonlocal buf
            buf, n = ctypes.create_string_buffer(capacity), c_size_t()
            status = lib().dllm_chat_render(self._handle(), msgs, len(pairs), int(add_generation_prompt), buf,
                                            capacity, byref(n))
            return status, n.value

        _retrying(call, 256 + sum(len(c) + 64 for _, c in pairs))
        rendered = to_str(buf.value)
        return self.encode(rendered) if tokenize else rendered
