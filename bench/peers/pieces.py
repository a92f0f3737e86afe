"""Jitted parts of the peer bench timed alone (docs/research/performance_sessions.md, "limits").

  python bench/peers/pieces.py [--repeats 3]

At the peer comparison's RM shape (32 sequences x 560 tokens, d_model 256, 4 heads of 64) and
with the same best-of-`repeats` timing as bench/peers/jax_side.py: the measured matmul peak;
matmuls of the model's shapes in float32 and in bfloat16 (bfloat16 out, and float32 accumulation);
GELU and its gradient on one layer's MLP activations; one layer's attention, forward and forward +
backward, for each kernel; and the whole model's forward + backward with its layers scanned and
unrolled. Prints a line per piece; asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jax_side import best_seconds, model_config  # noqa: E402

from rlhfjax.models import attention  # noqa: E402
from rlhfjax.models import transformer  # noqa: E402

SEQS, T, HEADS, DH = 32, 560, 4, 64


def ms(fn, *args, repeats: int) -> float:
  return 1e3 * best_seconds(lambda: fn(*args), repeats)[0]


def matmuls(repeats: int) -> None:
  shapes = [(2048, 2048, 2048), (SEQS * T, 256, 1024), (SEQS * T, 1024, 256), (SEQS * T, 256, 768)]
  for m, k, n in shapes:
    x = jax.random.normal(jax.random.key(0), (m, k))
    w = jax.random.normal(jax.random.key(1), (k, n))
    xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    rates = []
    for fn, args in ((lambda a, b: a @ b, (x, w)), (lambda a, b: a @ b, (xb, wb)),
                     (lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32), (xb, wb))):
      rates.append(2 * m * k * n / ms(jax.jit(fn), *args, repeats=repeats) / 1e6)
    print(f"matmul {m} x {k} x {n}: float32 {rates[0]:.0f}, bfloat16 {rates[1]:.0f}, bfloat16 "
          f"with float32 accumulation {rates[2]:.0f} GFLOP/s")


def gelu(repeats: int) -> None:
  x = jax.random.normal(jax.random.key(0), (SEQS * T, 1024))
  fwd = ms(jax.jit(functools.partial(jax.nn.gelu, approximate=True)), x, repeats=repeats)
  grad = ms(jax.jit(jax.grad(lambda x: jax.nn.gelu(x, approximate=True).sum())), x,
            repeats=repeats)
  print(f"GELU (tanh) on {SEQS * T} x 1024: forward {fwd:.0f} ms, gradient {grad:.0f} ms")


def attention_kernels(repeats: int) -> None:
  q, k, v = (jax.random.normal(jax.random.key(i), (SEQS, T, HEADS, DH)) for i in range(3))
  allowed = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (SEQS, T, T))
  kernels = {
      "reference": lambda q, k, v: attention.reference(q, k, v, allowed),
      "chunked, causal blocks of 128": lambda q, k, v: attention.chunked(q, k, v, allowed, 128,
                                                                         causal=True),
      "jax.nn.dot_product_attention(is_causal=True)":
          lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True)}
  for name, fn in kernels.items():
    grad = jax.grad(lambda q, k, v, fn=fn: fn(q, k, v).sum(), argnums=(0, 1, 2))
    print(f"attention, one layer, {SEQS} x {T}, {name}: forward "
          f"{ms(jax.jit(fn), q, k, v, repeats=repeats):.0f} ms, forward + backward "
          f"{ms(jax.jit(grad), q, k, v, repeats=repeats):.0f} ms")


def layers(repeats: int) -> None:
  tokens = jnp.asarray(np.random.default_rng(0).integers(4, 2000, (SEQS, T)), jnp.int32)
  mask = jnp.ones((SEQS, T), bool)
  for scan in (True, False):
    cfg = model_config("chunked", 128, scan)
    params = transformer.init(jax.random.key(0), cfg)
    grad = jax.jit(jax.grad(
        lambda p, cfg=cfg: transformer.forward(p, tokens, cfg, mask=mask)[0][:, -1].sum()))
    print(f"model forward + backward, {SEQS} x {T}, chunked attention, layers "
          f"{'scanned' if scan else 'unrolled'}: {ms(grad, params, repeats=repeats):.0f} ms")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args()
  print(f"{jax.devices()[0].device_kind} x{jax.device_count()}, {os.cpu_count()} cpus, "
        f"jax {jax.__version__}")
  matmuls(args.repeats)
  gelu(args.repeats)
  attention_kernels(args.repeats)
  layers(args.repeats)


if __name__ == "__main__":
  main()
