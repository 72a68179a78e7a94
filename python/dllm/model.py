"""Model: a loaded checkpoint (dllm_model_*), with its tokenizer when the directory has one."""
import dataclasses
import os
import weakref
from ctypes import byref, c_double, c_void_p

from . import _types as T
from ._capi import NativeHandle, check, enum_value, fill_struct, lib
from .tokenizer import Tokenizer

_TOKENIZER_FILES = ("tokenizer.json", "vocab.json")


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """dllm_model_info (see dllm.h), family and precision as enums."""
    family: T.Family
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    max_seq_len: int
    shift_logits: int
    mask_id: int
    eos_id: int
    eot_id: int
    bos_id: int
    n_params: int
    block_size: int
    stop_id: int
    precision: T.Precision
    quantized_lm_head: int


class Model(NativeHandle):
    """A model directory loaded with dllm_model_load. Closing it closes the contexts created on it first (the
    library requires the model to outlive them) and its tokenizer."""

    _kind, _free_name = "model", "dllm_model_free"

    def __init__(self, path, *, use_mmap=True, tokenizer=None):
        """tokenizer: None loads the directory's tokenizer if it has tokenizer files, True requires them,
        False skips them (model.tokenizer is then None)."""
        params = lib().dllm_model_default_params()
        params.use_mmap = int(use_mmap)
        out = c_void_p()
        check(lib().dllm_model_load(os.fsencode(path), params, byref(out)))
        self._setup(out.value, path)
        if tokenizer is None:
            tokenizer = any(os.path.exists(os.path.join(path, f)) for f in _TOKENIZER_FILES)
        try:
            if tokenizer:
                self.tokenizer = Tokenizer(path)
                self.tokenizer.check_model(self)
        except BaseException:
            self.close()
            raise

    @classmethod
    def random(cls, config_path, seed=0):
        """A model of config.json's shape with random weights generated on the GPU (dllm_model_load_random)."""
        out = c_void_p()
        check(lib().dllm_model_load_random(os.fsencode(config_path), seed, byref(out)))
        model = cls.__new__(cls)
        model._setup(out.value, config_path)
        return model

    def _setup(self, ptr, path):
        self.path = path
        self.tokenizer = None
        self._contexts = weakref.WeakSet()
        self._adopt(ptr)
        raw = T.ModelInfo()
        check(lib().dllm_model_get_info(ptr, byref(raw)))
        fields = {name: getattr(raw, name) for name, _ in T.ModelInfo._fields_}
        fields["family"] = T.Family(fields["family"])
        fields["precision"] = T.Precision(fields["precision"])
        self.info = ModelInfo(**fields)

    family = property(lambda self: self.info.family)
    n_vocab = property(lambda self: self.info.n_vocab)
    mask_id = property(lambda self: self.info.mask_id)
    eos_id = property(lambda self: self.info.eos_id)
    max_seq_len = property(lambda self: self.info.max_seq_len)
    block_size = property(lambda self: self.info.block_size, doc="block diffusion's block; 0 for LLaDA and Dream")

    @property
    def is_block_diffusion(self):
        return self.info.block_size > 0

    def kv_bytes_per_token(self, kv_quant="none", block_length=0):
        """Bytes of committed K/V cache per token under kv_quant (dllm_kv_bytes_per_token)."""
        out = c_double()
        check(lib().dllm_kv_bytes_per_token(self._handle(), enum_value(T.KvQuant, kv_quant), block_length, byref(out)))
        return out.value

    def quantize(self, out_dir, precision, progress=None, **options):
        """Writes a SoloQ-quantised copy of this model to out_dir (dllm_model_quantize). options: the
        dllm_quantize_params fields (quantize_lm_head, n_threads, overwrite, max_shard_bytes); progress(done,
        total) is called after each layer."""
        params = fill_struct(lib().dllm_quantize_default_params(), dict(options, precision=precision),
                             skip=("progress", "progress_user_data"))
        # a local keeps the thunk alive through the call: ctypes frees it with its Python object
        callback = T.QUANTIZE_PROGRESS_FN(lambda done, total, _: progress(done, total)) if progress else None
        if callback:
            params.progress = callback
        check(lib().dllm_model_quantize(self._handle(), os.fsencode(out_dir), byref(params)))

    def close(self):
        for ctx in list(getattr(self, "_contexts", ())):
            ctx.close()
        if getattr(self, "tokenizer", None) is not None:
            self.tokenizer.close()
        super().close()

    def __repr__(self):
        state = "closed" if self.closed else f"{self.info.family.name}, vocab {self.info.n_vocab}"
        return f"<dllm.Model {self.path!r} ({state})>"
