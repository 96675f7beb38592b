"""torchtitan model flavors placer has no preset for, as placer Models.

Facts copied from torchtitan v0.2.2 (73a0e69) torchtitan/models/qwen3/__init__.py
``qwen3_configs``: dim, n_layers, n_heads, n_kv_heads, head_dim, hidden_dim (the SwiGLU FFN
width), vocab_size, max_seq_len and enable_weight_tying. The same flavors are the Python
configs' ``model_registry("<flavor>")`` of torchtitan/models/qwen3 in later releases.
"""

from __future__ import annotations

from placer.spec.model import Model
from placer.spec.presets import validated

# (model, flavor) -> (layers, dim, heads, kv heads, ffn, tied embeddings)
_QWEN3 = {
    "0.6b": (28, 1024, 16, 8, 3072, True),
    "1.7b": (28, 2048, 16, 8, 6144, True),
    "4b": (36, 2560, 32, 8, 9728, True),
    "8b": (36, 4096, 32, 8, 12288, False),
    "14b": (40, 5120, 40, 8, 17408, False),
    "32b": (64, 5120, 64, 8, 25600, False),
}
QWEN3_VOCAB = 151936
QWEN3_HEAD_DIM = 128
QWEN3_MAX_SEQ_LEN = 4096


def flavor_model(name: str, flavor: str) -> Model | None:
    """The Model of torchtitan's ``name``/``flavor``, if this table holds it."""
    if name.lower() != "qwen3" or flavor.lower() not in _QWEN3:
        return None
    layers, dim, heads, kv_heads, ffn, tied = _QWEN3[flavor.lower()]
    return validated(Model, {
        "name": f"qwen3-{flavor.lower()}", "num_layers": layers, "hidden_size": dim,
        "num_attention_heads": heads, "num_kv_heads": kv_heads, "head_dim": QWEN3_HEAD_DIM,
        "ffn_hidden_size": ffn, "gated_mlp": True, "vocab_size": QWEN3_VOCAB,
        "tied_embeddings": tied, "max_seq_len": QWEN3_MAX_SEQ_LEN,
    }, f"torchtitan {name} {flavor}")
