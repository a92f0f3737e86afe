"""Analytic FLOPs of the decoder: what MFU is measured against.

XLA's cost analysis counts the body of a `lax.scan` once, so for the layer-scanned model it reports
about 1/n_layers of the work; these formulas count every matmul instead (2 FLOPs per
multiply-add), as MaxText and the PaLM paper do: the projections and MLP of every layer, the
attention scores and their weighted sum, and the language-model head where logits are taken.
Norms, softmax, RoPE and the optimizer are left out (well under 1% at real sizes). A backward pass
costs twice its forward pass. Causal attention counts the half of the T x S score matrix a causal
kernel computes (MaxText's convention since 2024); `causal_half=False` counts the whole matrix,
which is what the reference attention computes and what `tests/test_compile.py` checks against
XLA's count of an unscanned model. A sliding-window layer (Gemma's local layers) counts the scores
inside its window only, as a kernel that skips the blocks outside it does (splash's local mask): a
query sees at most `sliding_window` keys, fewer near the start under causal_half; with
`causal_half=False` every layer counts the whole matrix, window or not (the reference computes it
masked).
"""

from __future__ import annotations

from rlhfjax.models.config import ModelConfig


def layer_matmul_params(cfg: ModelConfig) -> int:
  """Multiply-adds per token of one layer's projections and MLP (its matmul weights)."""
  d, h, kv, dh, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.dim_per_head, cfg.d_ff
  mlp = (3 if cfg.variant == "llama" else 2) * d * f
  return d * (h + 2 * kv) * dh + h * dh * d + mlp


def forward(cfg: ModelConfig, batch: int, tokens: int, *, keys: int | None = None,
            logit_tokens: int | None = None, causal_half: bool = True) -> float:
  """FLOPs of one forward pass of `batch` sequences of `tokens` new tokens attending over `keys`
  positions (default: the tokens themselves; a decode step attends over its whole cache), with
  logits at `logit_tokens` positions per sequence (default: every token; 0: no LM head)."""
  keys = tokens if keys is None else keys
  logit_tokens = tokens if logit_tokens is None else logit_tokens
  matmuls = 2 * batch * tokens * cfg.n_layers * layer_matmul_params(cfg)
  causal = causal_half and keys == tokens
  pairs = tokens * keys / 2 if causal else tokens * keys  # Query-key pairs of a global layer.
  w = cfg.sliding_window
  if not causal_half or not w:
    local_pairs = pairs
  elif causal:  # The triangle up to the window, then w keys per query.
    local_pairs = min(tokens, w) ** 2 / 2 + max(tokens - w, 0) * w
  else:  # Queries at the end of `keys` positions (a decode step, a prompt after a cache).
    local_pairs = tokens * min(keys, w)
  n_local = sum(cfg.local_layers)
  attention = (4 * batch * cfg.n_heads * cfg.dim_per_head
               * ((cfg.n_layers - n_local) * pairs + n_local * local_pairs))
  head = 2 * batch * logit_tokens * cfg.d_model * cfg.vocab_size
  return float(matmuls + attention + head)


def training(cfg: ModelConfig, batch: int, tokens: int, **kwargs) -> float:
  """FLOPs of a forward and backward pass (3x the forward; rematerialisation not counted: it is
  hardware work, not model work)."""
  return 3 * forward(cfg, batch, tokens, **kwargs)
