"""Import a Hugging Face ``config.json`` (placeholder replaced by the HF importer)."""

from __future__ import annotations

from typing import Any

from placer.spec.model import Model


def is_hf_config(data: dict[str, Any]) -> bool:
    return "model_type" in data or "num_hidden_layers" in data or "n_layer" in data


def model_from_hf_config(data: dict[str, Any], default_name: str, source: str) -> Model:
    from placer.spec.presets import validated

    fields = {
        "name": data.get("_name_or_path", default_name).split("/")[-1] or default_name,
        "num_layers": data.get("num_hidden_layers"),
        "hidden_size": data.get("hidden_size"),
        "num_attention_heads": data.get("num_attention_heads"),
        "num_kv_heads": data.get("num_key_value_heads"),
        "ffn_hidden_size": data.get("intermediate_size"),
        "vocab_size": data.get("vocab_size"),
    }
    return validated(Model, fields, source)
