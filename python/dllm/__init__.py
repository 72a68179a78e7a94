"""dllm: diffusion language models (LLaDA, Dream, Fast-dLLM v2) through libdllm.so, with ctypes only.

    import dllm
    with dllm.Model("models/tiny-llada") as model, dllm.Context(model, backend="cpu") as ctx:
        ids = model.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True)
        print(ctx.generate(ids, gen_length=32, steps=32, block_length=32).text)
"""
from ._capi import DllmError, library_candidates, lib, live_handles, set_log_handler
from ._types import (Backend, ChatTemplate, Dpad, Family, KvCache, KvQuant, Lacache, LogLevel, Precision,
                     Remasking, SoloqRotation, Status, Unmask)
from .context import BatchGeneration, Context, Generation, GenStats, gen_defaults
from .model import Model, ModelInfo
from .stepper import SeqEvent, Stepper
from .stream import Step, Stream
from .tokenizer import Tokenizer

__all__ = [
    "DllmError", "library_candidates", "library_path", "live_handles", "rng_uniform", "set_log_handler", "version",
    "Backend", "ChatTemplate", "Dpad", "Family", "KvCache", "KvQuant", "Lacache", "LogLevel", "Precision",
    "Remasking", "SoloqRotation", "Status", "Unmask", "BatchGeneration", "Context", "Generation", "GenStats", "gen_defaults",
    "Model", "ModelInfo", "SeqEvent", "Step", "Stepper", "Stream", "Tokenizer",
]


def version():
    """The loaded library's version, "MAJOR.MINOR.PATCH"."""
    return lib().dllm_version().decode()


def rng_uniform(seed, index, position, step, stream):
    """dllm's counter-based draw: a uniform float in (0, 1), a pure function of its arguments (streams >= 16 are
    free for applications; see dllm_rng_uniform)."""
    return lib().dllm_rng_uniform(seed, index, position, step, stream)


def library_path():
    """The libdllm.so this package loaded (see library_candidates() for the search order)."""
    return lib().path
