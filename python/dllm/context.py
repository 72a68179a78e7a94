"""Context: a model on a backend (dllm_ctx_*), and what it runs: generate, batches, logits, streams."""
import array
import dataclasses
import threading
import weakref
from ctypes import POINTER, byref, c_float, c_int, c_int32, c_void_p, cast

from . import _types as T
from ._capi import DllmError, NativeHandle, check, fill_struct, id_array, lib, struct_dict, to_str

try:
    import numpy
except ImportError:  # NumPy is optional: logits then come back as array.array rows
    numpy = None

# Set by the library itself (Stream sets on_step); not keyword arguments.
_CALLBACK_FIELDS = ("on_step", "on_step_data")
_CTX_CALLBACK_FIELDS = ("progress", "progress_user_data")


@dataclasses.dataclass(frozen=True)
class GenStats:
    """dllm_gen_stats (see dllm.h)."""
    n_prompt: int
    n_generated: int
    steps: int
    forwards: int
    wall_ms: float
    facache_rows: int
    facache_rows_reused: int

    @classmethod
    def from_c(cls, raw):
        return cls(**struct_dict(raw))


@dataclasses.dataclass(frozen=True)
class Generation:
    """One decoded prompt: the generated ids (prompt excluded), their text (None without a tokenizer), the
    stats, and the status (OK, or ERR_CANCELLED for a stream stopped early: ids are then the canvas so far)."""
    ids: list
    text: object
    stats: GenStats
    status: T.Status = T.Status.OK


class BatchGeneration(list):
    """generate_batch's Generations in prompt order, with the batch's own stats (dllm_generate_batch's)."""

    def __init__(self, generations, stats):
        super().__init__(generations)
        self.stats = stats


def gen_defaults():
    """dllm_gen_default_params() as a dict: the keyword arguments generate() takes and their defaults."""
    return struct_dict(lib().dllm_gen_default_params(), skip=_CALLBACK_FIELDS)


class Context(NativeHandle):
    """A model on a backend with its buffers (dllm_ctx_create). Keyword arguments: the dllm_ctx_params
    fields (backend="cpu", precision="fp8_ffn", n_threads=2, ...), the library's defaults otherwise;
    progress(done, total) is called after each layer the CPU backend quantises at creation.
    One generation runs at a time; another call meanwhile (e.g. during a stream) is a RuntimeError."""

    _kind, _free_name = "ctx", "dllm_ctx_free"

    def __init__(self, model, progress=None, **params):
        cp = fill_struct(lib().dllm_ctx_default_params(), params, skip=_CTX_CALLBACK_FIELDS)
        # a local keeps the thunk alive through the call: ctypes frees it with its Python object
        callback = T.QUANTIZE_PROGRESS_FN(lambda done, total, _: progress(done, total)) if progress else None
        if callback:
            cp.progress = callback
        out = c_void_p()
        check(lib().dllm_ctx_create(model._handle(), cp, byref(out)))
        self.model = model
        self._busy = threading.Lock()
        self._streams = weakref.WeakSet()
        self._steppers = weakref.WeakSet()
        self._adopt(out.value)
        model._contexts.add(self)

    @staticmethod
    def default_params():
        """dllm_ctx_default_params() as a dict."""
        return struct_dict(lib().dllm_ctx_default_params(), skip=_CTX_CALLBACK_FIELDS)

    @property
    def backend(self):
        """The backend the context runs on (never AUTO)."""
        return T.Backend(lib().dllm_ctx_get_backend(self._handle()))

    def close(self):
        """Cancels the context's streams, closes its steppers, waits for a generation running in another thread, frees
        the context."""
        for stream in list(getattr(self, "_streams", ())):
            stream.close()
        for stepper in list(getattr(self, "_steppers", ())):
            stepper.close()
        if self._ptr is not None:
            with self._busy:
                super().close()

    def _acquire(self):
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("the context is running another generation (a stream not finished or closed?)")
        return self._handle()

    def _gen_params(self, options):
        gp = fill_struct(lib().dllm_gen_default_params(), options, skip=_CALLBACK_FIELDS)
        if "gen_length" in options and "steps" not in options:
            gp.steps = min(gp.steps, gp.gen_length)  # the library refuses steps that could commit nothing
        return gp

    def _prompt_ids(self, prompt):
        """Token ids as given, or a string's tokens (as written: apply_chat_template is the caller's choice)."""
        if isinstance(prompt, str):
            if self.model.tokenizer is None:
                raise ValueError("a text prompt needs the model's tokenizer; pass token ids")
            return self.model.tokenizer.encode(prompt)
        return prompt

    def _generation(self, out, n_out, stats, status=T.Status.OK):
        ids = list(out[:n_out])
        tok = self.model.tokenizer
        return Generation(ids, tok.decode(ids) if tok else None, GenStats.from_c(stats), T.Status(status))

    def _run_generate(self, handle, prompt, gp):
        """dllm_generate on a context already acquired; a cancelled run returns its canvas so far."""
        ids = id_array(prompt)
        capacity = gp.gen_length + 1  # block diffusion may end with its AR seed
        out, n_out, stats = (c_int32 * max(capacity, 1))(), c_int(), T.GenStats()
        status = lib().dllm_generate(handle, ids, len(ids), gp, out, capacity, byref(n_out), byref(stats))
        if status != T.Status.ERR_CANCELLED:
            check(status, handle)
        return self._generation(out, n_out.value, stats, status)

    def generate(self, prompt, **params):
        """Decodes one prompt (token ids or text). Keyword arguments: the dllm_gen_params fields
        (gen_length=64, steps=64, block_length=32, remasking="low_confidence", threshold=0.9, ...); the
        library's defaults (gen_defaults()) otherwise."""
        gp = self._gen_params(params)
        prompt = self._prompt_ids(prompt)
        handle = self._acquire()
        try:
            return self._run_generate(handle, prompt, gp)
        finally:
            self._busy.release()

    def stream(self, prompt, **params):
        """A Stream over the steps of one generation (generate's arguments); stopping it early cancels."""
        from .stream import Stream
        stream = Stream(self, self._prompt_ids(prompt), self._gen_params(params))
        self._streams.add(stream)
        return stream

    def generate_batch(self, prompts, per_prompt=None, **params):
        """Decodes prompts together (dllm_generate_batch); each gets what generate() would give it alone.
        params apply to every prompt, per_prompt (a list of dicts, one a prompt) override them. A failing
        item raises DllmError after the batch, with .results: a Generation or a DllmError per prompt."""
        per_prompt = per_prompt or [{}] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise ValueError("per_prompt needs one dict per prompt")
        items = (T.BatchItem * len(prompts))()
        buffers = []  # the prompt and output arrays, alive through the call
        for item, prompt, own in zip(items, prompts, per_prompt):
            ids = id_array(self._prompt_ids(prompt))
            item.params = self._gen_params({**params, **own})
            item.out_capacity = item.params.gen_length + 1
            out = (c_int32 * max(item.out_capacity, 1))()
            buffers.append(out)
            item.prompt, item.n_prompt, item.out = cast(ids, POINTER(c_int32)), len(ids), out
            buffers.append(ids)
        results, stats = (T.BatchResult * len(prompts))(), T.GenStats()
        handle = self._acquire()
        try:
            status = lib().dllm_generate_batch(handle, items, len(prompts), results, byref(stats))
            message = to_str(lib().dllm_ctx_last_error(handle))
        finally:
            self._busy.release()
        outcomes = [self._generation(item.out, r.n_out, r.stats) if r.status == T.Status.OK
                    else DllmError(r.status, to_str(r.error)) for item, r in zip(items, results)]
        if status != T.Status.OK:
            error = DllmError(status, message)
            error.results = outcomes
            raise error
        return BatchGeneration(outcomes, GenStats.from_c(stats))

    def logits(self, ids, row_begin=0, row_end=None):
        """Logits of one forward over ids for rows [row_begin, row_end) (dllm_logits): a float32 NumPy array
        (rows, n_vocab), or without NumPy a list of array.array('f') rows."""
        arr = id_array(ids)
        row_end = len(arr) if row_end is None else row_end
        n_rows, n_vocab = max(row_end - row_begin, 0), self.model.n_vocab
        if numpy is not None:
            out = numpy.empty((n_rows, n_vocab), dtype=numpy.float32)
            ptr = out.ctypes.data_as(POINTER(c_float))
        else:
            out = (c_float * (n_rows * n_vocab))()
            ptr = out
        handle = self._acquire()
        try:
            check(lib().dllm_logits(handle, arr, len(arr), row_begin, row_end, ptr, n_rows * n_vocab), handle)
        finally:
            self._busy.release()
        if numpy is not None:
            return out
        flat = array.array("f", bytes(out))
        return [flat[r * n_vocab:(r + 1) * n_vocab] for r in range(n_rows)]

    def __repr__(self):
        return "<dllm.Context (closed)>" if self.closed else f"<dllm.Context {self.backend.name} on {self.model!r}>"
