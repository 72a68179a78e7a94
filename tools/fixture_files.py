"""What dllm's fixture generators share: the tiny LLaDA and Dream configs, bfloat16 rounding, a safetensors writer, the
JSON files of a model directory and their --check (regenerate, then compare). Imported by tools/make_fixtures.py,
make_headdim_fixtures.py and make_bd_fixtures.py (run from the repository root or anywhere: each script's directory is
on sys.path)."""

import filecmp
import json
import os
import struct
import tempfile

import numpy as np


# The config.json of tests/data/tiny-llada and tiny-dream (tools/make_fixtures.py): the real schema at tiny sizes.
# Other fixtures change a few sizes and ids and keep the rest (and the key order) with dict(LLADA_CFG, d_model=...).
LLADA_CFG = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                 "AutoModel": "modeling_llada.LLaDAModelLM"},
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 128,
    "embedding_dropout": 0.0, "embedding_size": 136, "eos_token_id": 128, "flash_attention": False,
    "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
    "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
    "layer_norm_with_affine": True, "mask_token_id": 130, "max_sequence_length": 256, "mlp_hidden_size": 200,
    "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None, "n_heads": 2, "n_kv_heads": 2,
    "n_layers": 3, "pad_token_id": 128, "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05,
    "rope": True, "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
    "transformers_version": "4.46.3", "use_cache": False, "vocab_size": 131, "weight_tying": False,
}

DREAM_CFG = {
    "architectures": ["DreamModel"], "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "bos_token_id": 141, "eos_token_id": 138, "hidden_act": "silu", "hidden_size": 192, "initializer_range": 0.02,
    "intermediate_size": 328, "mask_token_id": 142, "max_position_embeddings": 256, "max_window_layers": 3,
    "model_type": "Dream", "num_attention_heads": 3, "num_hidden_layers": 3, "num_key_value_heads": 1,
    "pad_token_id": 138, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.46.2",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 144,
}


def layer_names(family, l):
    """The projections of layer l under their HF names (Dream's q/k/v biases under bq/bk/bv)."""
    if family == "llada":
        p = f"model.transformer.blocks.{l}."
        return dict(an=p + "attn_norm.weight", q=p + "q_proj.weight", k=p + "k_proj.weight", v=p + "v_proj.weight",
                    o=p + "attn_out.weight", fn=p + "ff_norm.weight", g=p + "ff_proj.weight", u=p + "up_proj.weight",
                    dn=p + "ff_out.weight")
    p = f"model.layers.{l}."
    return dict(an=p + "input_layernorm.weight", q=p + "self_attn.q_proj.weight", k=p + "self_attn.k_proj.weight",
                v=p + "self_attn.v_proj.weight", o=p + "self_attn.o_proj.weight",
                fn=p + "post_attention_layernorm.weight", g=p + "mlp.gate_proj.weight", u=p + "mlp.up_proj.weight",
                dn=p + "mlp.down_proj.weight",
                bq=p + "self_attn.q_proj.bias", bk=p + "self_attn.k_proj.bias", bv=p + "self_attn.v_proj.bias")


def bf16(a):
    """float -> (bfloat16 bits, round to nearest even; the float64 values they hold)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype, shape, raw bytes). Header padded with spaces to 8 bytes."""
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, dtype, shape, raw in sorted(tensors, key=lambda t: t[0]):
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def tokenizer_config(tokens):
    return {"add_bos_token": False, "add_eos_token": False,
            "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                              "single_word": False, "special": True} for i, c in tokens}}


def fixture_differences(root, make_all, same=None):
    """--check: runs make_all(dir) in a temporary directory and compares every file it writes with root's; returns the
    paths (relative to root) that are missing there or differ: byte for byte, or where same(rel, path_in_root,
    fresh_path) is false (make_fixtures.py's logits, whose last bits follow the torch build)."""
    same = same or (lambda _rel, a, b: filecmp.cmp(a, b, shallow=False))
    bad = []
    with tempfile.TemporaryDirectory() as fresh:
        make_all(fresh)
        for dirpath, _, files in sorted(os.walk(fresh)):
            for name in sorted(files):
                rel = os.path.relpath(os.path.join(dirpath, name), fresh)
                a, b = os.path.join(root, rel), os.path.join(fresh, rel)
                if not (os.path.exists(a) and same(rel, a, b)):
                    bad.append(rel)
    return bad
