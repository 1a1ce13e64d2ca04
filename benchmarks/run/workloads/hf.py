"""`--workload hf:MODEL`: a Hugging Face transformers model built from its configuration class, with random
weights and synthetic tokens; nothing is downloaded (the hub is set offline before transformers loads).

`hf:gpt2` and `hf:bert-base-uncased` are their configuration classes' defaults (GPT2Config, BertConfig);
`hf:CONFIG_CLASS:key=value,...` overrides fields of any configuration class, and `context=N` sets the
sequence length (default 128). Dropout is set to 0 unless given, so every backend computes the same function.
A model type with a masked-LM head and no causal-only one (BERT, RoBERTa) trains masked-token prediction,
any other next-token prediction.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from benchmarks.catalog import HF_DEFAULTS
from benchmarks.run.workloads import Workload
from benchmarks.run.workloads.builtin import token_correct, token_loss

DEFAULT_CONTEXT = 128
MASKED_SHARE = 0.15


class LogitsOnly(nn.Module):
    """The model's logits alone: the harness's loss takes a tensor, not a ModelOutput."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits


def _config(name: str, overrides: dict[str, Any]) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    cls = getattr(transformers, name, None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PretrainedConfig)):
        raise ValueError(
            f"transformers has no configuration class '{name}'; use hf:gpt2, hf:bert-base-uncased "
            "or hf:CONFIG_CLASS (e.g. hf:GPT2Config:n_layer=2)"
        )
    fields = cls().to_dict()
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(f"{name} has no field '{unknown[0]}' (fields include {', '.join(list(fields)[:12])}, ...)")
    no_dropout = {k: 0.0 for k, v in fields.items() if ("dropout" in k or "pdrop" in k) and isinstance(v, float)}
    return cls(**{**no_dropout, **overrides})


def build(seed: int, train_size: int | None, val_size: int | None, config: str, **overrides: Any) -> Workload:
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.models.auto import modeling_auto

    context = overrides.pop("context", DEFAULT_CONTEXT)
    hf_config = _config(config, overrides)
    longest = getattr(hf_config, "n_positions", None) or getattr(hf_config, "max_position_embeddings", None)
    if not isinstance(context, int) or context < 1 or (longest and context > longest):
        raise ValueError(f"context={context} must be a positive integer up to the model's {longest} positions")
    kind = hf_config.model_type
    masked = kind in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    masked = masked or kind not in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    auto = AutoModelForMaskedLM if masked else AutoModelForCausalLM
    vocab = hf_config.vocab_size
    n_train = train_size or HF_DEFAULTS["train_size"]
    n_val = val_size or HF_DEFAULTS["val_size"]
    g = torch.Generator().manual_seed(seed * 1_000_003 + 5)
    n = n_train + n_val
    # Arithmetic progressions mod the vocabulary (as the built-in transformer): learnable, seeded by index.
    start = torch.randint(0, vocab, (n, 1), generator=g)
    stride = torch.randint(1, 8, (n, 1), generator=g)
    tokens = (start + stride * torch.arange(context + 1)) % vocab
    if masked:  # the last token id stands in for [MASK]; every position is predicted
        y = tokens[:, :-1]
        x = torch.where(torch.rand(y.shape, generator=g) < MASKED_SHARE, vocab - 1, y)
    else:
        x, y = tokens[:, :-1], tokens[:, 1:]
    return Workload(
        name=f"hf:{config}",
        build_model=lambda: LogitsOnly(auto.from_config(hf_config)),
        train=(x[:n_train], y[:n_train]),
        val=(x[n_train:], y[n_train:]),
        loss=token_loss,
        correct=token_correct,
        args={
            "config": config,
            "model_type": kind,
            "objective": "masked" if masked else "causal",
            "context": context,
            **overrides,
        },
    )
