"""ctypes mirrors of dllm.h's enums, structs and callback types.

Field order and C types follow dllm.h one for one; tests/test_layout.py compares every struct's size and field
offsets, and every enum's constants, against the header through the C compiler, so a drift fails a test.
"""
import ctypes
import enum
from ctypes import c_char, c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_size_t, c_uint64, c_void_p

# C enums are int-sized on every ABI dllm builds for.
c_enum = c_int


class Status(enum.IntEnum):
    OK = 0
    ERR_INVALID_ARGUMENT = -1
    ERR_IO = -2
    ERR_FORMAT = -3
    ERR_SHAPE = -4
    ERR_UNSUPPORTED = -5
    ERR_OUT_OF_MEMORY = -6
    ERR_NO_DEVICE = -7
    ERR_CUDA = -8
    ERR_JIT = -9
    ERR_CANCELLED = -10
    ERR_BUFFER_TOO_SMALL = -11
    ERR_INTERNAL = -12
    ERR_FULL = -13


class LogLevel(enum.IntEnum):
    ERROR = 0
    WARN = 1
    INFO = 2
    DEBUG = 3


class Family(enum.IntEnum):
    LLADA = 0
    DREAM = 1
    FAST_DLLM_V2 = 2
    NEMOTRON_DIFFUSION = 3
    LLADA2 = 4


class ChatTemplate(enum.IntEnum):
    NONE = 0
    LLADA = 1
    CHATML = 2
    LLADA2 = 3


class Backend(enum.IntEnum):
    AUTO = 0
    CPU = 1
    GPU = 2


class Precision(enum.IntEnum):
    AUTO = -1
    BF16 = 0
    FP8_FFN = 1
    FP8_ALL = 2
    SOLOQ_N = 3
    SOLOQ_I = 4
    SOLOQ_C = 5
    RTN_W4A4 = 6
    SOLOQ_N_W4A16 = 7
    SOLOQ_I_W4A16 = 8
    SOLOQ_C_W4A16 = 9
    RTN_W4A16 = 10


class KvQuant(enum.IntEnum):
    NONE = 0
    SOLOQ_KV4 = 1
    SOLOQ_KV2 = 2
    KIVI_KV4 = 3
    KIVI_KV2 = 4


class SoloqRotation(enum.IntEnum):
    DEFAULT = 0
    NONE = 1
    HADAMARD = 2
    RPBH = 3
    MIXER = 4
    KRPBH = 5
    HAAR = 6


class Remasking(enum.IntEnum):
    LOW_CONFIDENCE = 0
    RANDOM = 1
    MARGIN = 2
    ENTROPY = 3
    ORIGIN = 4


class Lacache(enum.IntEnum):
    OFF = 0
    TRUNCATE = 1
    ON = 2


class Unmask(enum.IntEnum):
    SCHEDULE = 0
    THRESHOLD = 1
    FACTOR = 2
    TIMESTEPS = 3


class KvCache(enum.IntEnum):
    NONE = 0
    PREFIX = 1
    DUAL = 2


class Dpad(enum.IntEnum):
    OFF = 0
    GAUSSIAN = 1
    UNIFORM = 2


# C typedef name -> (Python enum, prefix of its constants in dllm.h); the layout test walks this table.
C_ENUMS = {
    "dllm_status": (Status, "DLLM_"),
    "dllm_log_level": (LogLevel, "DLLM_LOG_"),
    "dllm_family": (Family, "DLLM_FAMILY_"),
    "dllm_chat_template": (ChatTemplate, "DLLM_CHAT_"),
    "dllm_backend": (Backend, "DLLM_BACKEND_"),
    "dllm_precision": (Precision, "DLLM_PRECISION_"),
    "dllm_kv_quant": (KvQuant, "DLLM_KV_QUANT_"),
    "dllm_soloq_rotation": (SoloqRotation, "DLLM_SOLOQ_ROTATION_"),
    "dllm_remasking": (Remasking, "DLLM_REMASK_"),
    "dllm_lacache": (Lacache, "DLLM_LACACHE_"),
    "dllm_unmask": (Unmask, "DLLM_UNMASK_"),
    "dllm_kv_cache": (KvCache, "DLLM_KV_CACHE_"),
    "dllm_dpad": (Dpad, "DLLM_DPAD_"),
}

MAX_DEVICES = 8  # DLLM_MAX_DEVICES


class ModelParams(ctypes.Structure):
    _fields_ = [("use_mmap", c_int)]


class ModelInfo(ctypes.Structure):
    _fields_ = [
        ("family", c_enum), ("n_vocab", c_int), ("n_embd", c_int), ("n_layer", c_int), ("n_head", c_int),
        ("n_head_kv", c_int), ("head_dim", c_int), ("n_ff", c_int), ("max_seq_len", c_int), ("shift_logits", c_int),
        ("mask_id", c_int32), ("eos_id", c_int32), ("eot_id", c_int32), ("bos_id", c_int32), ("n_params", c_int64),
        ("block_size", c_int), ("stop_id", c_int32), ("precision", c_int), ("quantized_lm_head", c_int),
    ]


class ChatMessage(ctypes.Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


QUANTIZE_PROGRESS_FN = ctypes.CFUNCTYPE(None, c_int, c_int, c_void_p)


class CtxParams(ctypes.Structure):
    _fields_ = [
        ("backend", c_enum), ("device", c_int), ("max_tokens", c_int), ("n_threads", c_int), ("precision", c_enum),
        ("quantize_lm_head", c_int), ("kv_quant", c_enum), ("kv_sink_tokens", c_int), ("n_devices", c_int),
        ("devices", c_int * MAX_DEVICES), ("soloq_rotation", c_enum), ("soloq_bias_correction", c_int),
        ("progress", QUANTIZE_PROGRESS_FN), ("progress_user_data", c_void_p),
    ]


class StepInfo(ctypes.Structure):
    _fields_ = [
        ("block", c_int), ("n_blocks", c_int), ("step", c_int), ("steps_per_block", c_int), ("global_step", c_int),
        ("total_steps", c_int), ("n_committed", c_int), ("committed_pos", ctypes.POINTER(c_int32)),
        ("canvas", ctypes.POINTER(c_int32)), ("canvas_len", c_int), ("prompt_len", c_int), ("n_masked", c_int),
    ]


STEP_FN = ctypes.CFUNCTYPE(c_int, ctypes.POINTER(StepInfo), c_void_p)
LOG_FN = ctypes.CFUNCTYPE(None, c_enum, c_char_p, c_void_p)


class GenParams(ctypes.Structure):
    _fields_ = [
        ("gen_length", c_int), ("steps", c_int), ("block_length", c_int), ("temperature", c_float),
        ("cfg_scale", c_float), ("remasking", c_enum), ("seed", c_uint64), ("logits_eos_inf", c_int),
        ("confidence_eos_eot_inf", c_int), ("stop_at_eos", c_int), ("lacache", c_enum), ("unmask", c_enum),
        ("threshold", c_double), ("factor", c_double), ("eps", c_double), ("alg_temp", c_double),
        ("kv_cache", c_enum), ("dpad", c_enum), ("dpad_window", c_int), ("dpad_k", c_float),
        ("dpad_scale", c_float), ("dpad_n", c_int), ("early_stop", c_int), ("mask_id", c_int32),
        ("eos_id", c_int32), ("eot_id", c_int32), ("sub_block_length", c_int), ("block_cache", c_int),
        ("stop_id", c_int32), ("on_step", STEP_FN), ("on_step_data", c_void_p), ("top_k", c_int),
        ("top_p", c_float), ("min_p", c_float), ("edit_threshold", c_double), ("max_post_steps", c_int),
        ("tuned_forwards", c_int),
    ]


class GenStats(ctypes.Structure):
    _fields_ = [
        ("n_prompt", c_int), ("n_generated", c_int), ("steps", c_int), ("forwards", c_int), ("wall_ms", c_double),
        ("facache_rows", c_int), ("facache_rows_reused", c_int),
    ]


class BatchItem(ctypes.Structure):
    _fields_ = [
        ("prompt", ctypes.POINTER(c_int32)), ("n_prompt", c_int), ("params", GenParams),
        ("out", ctypes.POINTER(c_int32)), ("out_capacity", c_int),
    ]


class BatchResult(ctypes.Structure):
    _fields_ = [("status", c_enum), ("n_out", c_int), ("stats", GenStats), ("error", c_char * 256)]


class StepperParams(ctypes.Structure):
    _fields_ = [("max_sequences", c_int), ("max_fill_rows", c_int)]


class SeqEvent(ctypes.Structure):
    _fields_ = [("stepped", c_int), ("info", StepInfo), ("finished", c_int), ("result", BatchResult)]


class QuantizeParams(ctypes.Structure):
    _fields_ = [
        ("precision", c_enum), ("quantize_lm_head", c_int), ("n_threads", c_int), ("overwrite", c_int),
        ("max_shard_bytes", c_size_t), ("progress", QUANTIZE_PROGRESS_FN), ("progress_user_data", c_void_p),
        ("soloq_rotation", c_enum), ("soloq_bias_correction", c_int),
    ]


# C struct name -> mirror, for the layout test.
C_STRUCTS = {
    "dllm_model_params": ModelParams,
    "dllm_model_info": ModelInfo,
    "dllm_chat_message": ChatMessage,
    "dllm_ctx_params": CtxParams,
    "dllm_step_info": StepInfo,
    "dllm_gen_params": GenParams,
    "dllm_gen_stats": GenStats,
    "dllm_batch_item": BatchItem,
    "dllm_batch_result": BatchResult,
    "dllm_stepper_params": StepperParams,
    "dllm_seq_event": SeqEvent,
    "dllm_quantize_params": QuantizeParams,
}

# Struct fields that take an enum: keyword arguments may name the constant ("cpu", "dual") instead.
ENUM_FIELDS = {
    "backend": Backend, "precision": Precision, "kv_quant": KvQuant, "remasking": Remasking,
    "lacache": Lacache, "unmask": Unmask, "kv_cache": KvCache, "dpad": Dpad, "soloq_rotation": SoloqRotation,
}
