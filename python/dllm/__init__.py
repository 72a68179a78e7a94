"""dllm: diffusion language models (LLaDA, Dream, Fast-dLLM v2) through libdllm.so, with ctypes only.

    import dllm
    with dllm.Model("models/tiny-llada") as model, dllm.Context(model, backend="cpu") as ctx:
        ids = model.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True)
        print(ctx.generate(ids, gen_length=32, steps=32, block_length=32).text)
"""
from ._capi import DllmError, library_candidates, live_handles, lib
from ._types import (Backend, ChatTemplate, Dpad, Family, KvCache, KvQuant, Lacache, LogLevel, Precision,
                     Remasking, Status, Unmask)
from .context import BatchGeneration, Context, Generation, GenStats, gen_defaults
from .model import Model, ModelInfo
from .stream import Step, Stream
from .tokenizer import Tokenizer


def version():
    """The loaded library's version, "MAJOR.MINOR.PATCH"."""
    return lib().dllm_version().decode()


def library_path():
    """The libdllm.so this package loaded (see library_candidates() for the search order)."""
    return lib().path
