"""Finding and loading libdllm.so, its function prototypes, and errors as exceptions."""
import collections
import ctypes
import functools
import os
import threading
from ctypes import POINTER, c_char_p, c_double, c_int, c_int32, c_size_t, c_uint32, c_uint64, c_void_p

from . import _types as T

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def library_candidates():
    """Where libdllm.so is looked for, in order: $DLLM_LIB, the package directory, the repository's build/."""
    found = []
    if os.environ.get("DLLM_LIB"):
        found.append(os.environ["DLLM_LIB"])
    found.append(os.path.join(_PACKAGE_DIR, "libdllm.so"))
    found.append(os.path.normpath(os.path.join(_PACKAGE_DIR, "..", "..", "build", "libdllm.so")))
    return found


class DllmError(Exception):
    """A failing dllm call: `status` is the dllm.Status, `message` the library's detail (dllm_last_error)."""

    def __init__(self, status, message):
        name = to_str(lib().dllm_status_str(int(status)))  # "DLLM_ERR_IO", also for a status newer than T.Status
        try:
            status = T.Status(status)
        except ValueError:
            pass  # keep the number
        self.status = status
        self.message = message
        super().__init__(f"{name}: {message}" if message else name)


# (name, restype, argtypes) of every function the package calls.
_PROTOTYPES = [
    ("dllm_version", c_char_p, []),
    ("dllm_status_str", c_char_p, [T.c_enum]),
    ("dllm_last_error", c_char_p, []),
    ("dllm_log_set", None, [T.LOG_FN, c_void_p, T.c_enum]),
    ("dllm_model_default_params", T.ModelParams, []),
    ("dllm_model_load", T.c_enum, [c_char_p, T.ModelParams, POINTER(c_void_p)]),
    ("dllm_model_load_random", T.c_enum, [c_char_p, c_uint64, POINTER(c_void_p)]),
    ("dllm_model_free", None, [c_void_p]),
    ("dllm_model_get_info", T.c_enum, [c_void_p, POINTER(T.ModelInfo)]),
    ("dllm_tokenizer_load", T.c_enum, [c_char_p, POINTER(c_void_p)]),
    ("dllm_tokenizer_free", None, [c_void_p]),
    ("dllm_tokenizer_n_vocab", c_int, [c_void_p]),
    ("dllm_tokenizer_token_id", c_int32, [c_void_p, c_char_p]),
    ("dllm_tokenizer_check_model", T.c_enum, [c_void_p, c_void_p]),
    ("dllm_tokenize", T.c_enum, [c_void_p, c_char_p, c_size_t, c_int, POINTER(c_int32), c_int, POINTER(c_int)]),
    ("dllm_detokenize", T.c_enum, [c_void_p, POINTER(c_int32), c_int, c_int, c_char_p, c_size_t, POINTER(c_size_t)]),
    ("dllm_tokenizer_chat_template", T.c_enum, [c_void_p]),
    ("dllm_chat_render", T.c_enum,
     [c_void_p, POINTER(T.ChatMessage), c_int, c_int, c_char_p, c_size_t, POINTER(c_size_t)]),
    ("dllm_ctx_default_params", T.CtxParams, []),
    ("dllm_kv_bytes_per_token", T.c_enum, [c_void_p, T.c_enum, c_int, POINTER(c_double)]),
    ("dllm_quantize_default_params", T.QuantizeParams, []),
    ("dllm_model_quantize", T.c_enum, [c_void_p, c_char_p, POINTER(T.QuantizeParams)]),
    ("dllm_ctx_create", T.c_enum, [c_void_p, T.CtxParams, POINTER(c_void_p)]),
    ("dllm_ctx_free", None, [c_void_p]),
    ("dllm_ctx_last_error", c_char_p, [c_void_p]),
    ("dllm_ctx_get_backend", T.c_enum, [c_void_p]),
    ("dllm_logits", T.c_enum, [c_void_p, POINTER(c_int32), c_int, c_int, c_int, POINTER(ctypes.c_float), c_size_t]),
    ("dllm_gen_default_params", T.GenParams, []),
    ("dllm_generate", T.c_enum,
     [c_void_p, POINTER(c_int32), c_int, T.GenParams, POINTER(c_int32), c_int, POINTER(c_int), POINTER(T.GenStats)]),
    ("dllm_generate_batch", T.c_enum,
     [c_void_p, POINTER(T.BatchItem), c_int, POINTER(T.BatchResult), POINTER(T.GenStats)]),
    ("dllm_stepper_default_params", T.StepperParams, []),
    ("dllm_stepper_create", T.c_enum, [c_void_p, T.StepperParams, POINTER(c_void_p)]),
    ("dllm_stepper_free", None, [c_void_p]),
    ("dllm_stepper_can_add", T.c_enum, [c_void_p, POINTER(T.BatchItem)]),
    ("dllm_stepper_add", T.c_enum, [c_void_p, POINTER(T.BatchItem), POINTER(c_int)]),
    ("dllm_stepper_step", T.c_enum, [c_void_p]),
    ("dllm_stepper_n_active", c_int, [c_void_p]),
    ("dllm_stepper_poll", T.c_enum, [c_void_p, c_int, POINTER(T.SeqEvent)]),
    ("dllm_stepper_cancel", T.c_enum, [c_void_p, c_int]),
    ("dllm_stepper_remove", T.c_enum, [c_void_p, c_int]),
    ("dllm_rng_uniform", c_double, [c_uint64, c_uint32, c_uint32, c_uint32, c_uint32]),
]


@functools.lru_cache(maxsize=None)
def lib():
    """The loaded library with its prototypes set (loaded on first use, so that importing never fails)."""
    tried = []
    for path in library_candidates():
        if not os.path.exists(path):
            tried.append(f"{path} (missing)")
            continue
        handle = ctypes.CDLL(path)
        for name, restype, argtypes in _PROTOTYPES:
            fn = getattr(handle, name)
            fn.restype, fn.argtypes = restype, argtypes
        handle.path = path
        return handle
    raise OSError("libdllm.so not found; tried: " + "; ".join(tried) + ". Set DLLM_LIB to its path.")


def to_str(raw):
    return raw.decode("utf-8", errors="replace") if raw else ""


def check(status, ctx=None):
    """Raises DllmError for a failing status, with the context's message or else the thread's."""
    if status != T.Status.OK:
        detail = lib().dllm_ctx_last_error(ctx) if ctx else None
        raise DllmError(status, to_str(detail) or to_str(lib().dllm_last_error()))
    return status


# Native handles alive, by kind ("model", "tokenizer", "ctx", "stepper"): every wrapper counts its allocation and its
# free, so that a test can see that closing (or garbage collection) freed everything.
_live = collections.Counter()
_live_lock = threading.Lock()


def count_handle(kind, delta):
    with _live_lock:
        _live[kind] += delta


def live_handles():
    """Native objects currently held by this package, by kind (empty when everything was freed)."""
    with _live_lock:
        return {kind: n for kind, n in _live.items() if n}


def enum_value(enum_cls, value):
    """An enum field's value from a member, a number (checked by the library) or a name such as "cpu"."""
    if isinstance(value, str):
        try:
            return int(enum_cls[value.upper().replace("-", "_")])
        except KeyError:
            choices = ", ".join(m.name.lower() for m in enum_cls)
            raise ValueError(f"unknown {enum_cls.__name__} {value!r}; one of: {choices}") from None
    return int(value)


def fill_struct(struct, options, skip=()):
    """Sets struct fields from keyword options; unknown names are a TypeError, as for any Python call."""
    names = {name for name, _ in struct._fields_} - set(skip)
    for key, value in options.items():
        if key not in names:
            raise TypeError(f"unknown option {key!r}; options: {', '.join(sorted(names))}")
        if key in T.ENUM_FIELDS:
            value = enum_value(T.ENUM_FIELDS[key], value)
        field = getattr(struct, key)
        if isinstance(field, ctypes.Array):  # e.g. devices: the given entries, the rest keep their defaults
            if len(value) > len(field):
                raise ValueError(f"{key}: at most {len(field)} entries")
            field[:len(value)] = list(value)
        else:
            setattr(struct, key, value)
    return struct


def struct_dict(struct, skip=()):
    """A struct's fields as a dict, enum fields as members and arrays as lists."""
    fields = {}
    for name, _ in struct._fields_:
        if name in skip:
            continue
        value = getattr(struct, name)
        if isinstance(value, ctypes.Array):
            value = list(value)
        elif name in T.ENUM_FIELDS:
            value = T.ENUM_FIELDS[name](value)
        fields[name] = value
    return fields


def id_array(ids):
    """A C int32 array of token ids from any sequence of ints (a NumPy array included)."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return (c_int32 * len(ids))(*ids)


class NativeHandle:
    """Owns one native object: freed by close(), by leaving a `with` block, or at garbage collection."""

    _kind = ""        # the live_handles() key
    _free_name = ""   # the dllm_*_free function
    _ptr = None

    def _adopt(self, ptr):
        self._ptr = ptr
        count_handle(self._kind, +1)

    @property
    def closed(self):
        return self._ptr is None

    def _handle(self):
        if self._ptr is None:
            raise ValueError(f"{type(self).__name__} is closed")
        return self._ptr

    def close(self):
        """Frees the native object now; closing twice is harmless."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            getattr(lib(), self._free_name)(ptr)
            count_handle(self._kind, -1)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __del__(self):
        self.close()


_log_callback = None  # the installed thunk: the library calls it until replaced, so it must stay referenced


def set_log_handler(handler, max_level="warn"):
    """Routes the library's messages at or below max_level to handler(level: LogLevel, text: str) (dllm_log_set;
    process-wide, best set before loading models). None restores the default: stderr, warnings and errors."""
    global _log_callback
    if handler is None:
        lib().dllm_log_set(T.LOG_FN(), None, T.LogLevel.WARN)
        _log_callback = None
        return
    callback = T.LOG_FN(lambda level, message, _: handler(T.LogLevel(level), to_str(message)))
    lib().dllm_log_set(callback, None, enum_value(T.LogLevel, max_level))
    _log_callback = callback
