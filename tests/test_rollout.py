"""Rollouts at the hardware's bound: decoding that stops at the last eos, blocks that read only the
filled KV cache, and the rollout layout (parallel/rollout.py) the policy is copied into."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhfjax.errors import ConfigError
from rlhfjax.models import sampling
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from rlhfjax.parallel import rollout as parallel_rollout
from rlhfjax.parallel.mesh import make_mesh

AUTO = {"mesh": "auto", "dtype": "auto"}  # The `rollout` block's keys as configs/tldr_sim.py sets them.

# A vocabulary of 8: eos (1) comes often, so rows end at different steps.
CFG = ModelConfig(variant="llama", vocab_size=8, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                  d_ff=64, max_len=64)
PARAMS = transformer.init(jax.random.key(0), CFG)
PROMPTS = np.random.default_rng(0).integers(2, 8, (4, 5)).astype(np.int32)
MASK = np.ones_like(PROMPTS, bool)
MASK[::2, :2] = False
PROMPTS[~MASK] = 0
FULL = sampling.SamplingConfig(max_new_tokens=24, eos_id=1, pad_id=0, temperature=1.0,
                               early_stop=False)


def _sample(scfg, seed, k=1):
  return jax.tree.map(np.asarray, sampling.sample(PARAMS, PROMPTS, MASK, jax.random.key(seed), CFG,
                                                  scfg, k=k))


@pytest.mark.parametrize("seed,k,every_row_ends", [(0, 1, True), (0, 3, False)])
def test_early_stop_equals_the_full_length_loop(seed, k, every_row_ends):
  full = _sample(FULL, seed, k)
  early = _sample(dataclasses.replace(FULL, early_stop=True), seed, k)
  ended = full.lengths < FULL.max_new_tokens
  assert len(set(full.lengths[ended].tolist())) > 1  # Rows end at different steps.
  assert ended.all() == every_row_ends  # Either every row ends (an early exit) or one never does.
  assert full.steps == FULL.max_new_tokens
  if every_row_ends:
    # The loop stopped at the step after the last eos (whose draw, all padding, needs no forward).
    assert early.steps == full.lengths.max() + 1 < FULL.max_new_tokens
  else:
    assert early.steps == FULL.max_new_tokens
  for name in ("tokens", "logprobs", "lengths"):
    np.testing.assert_array_equal(getattr(early, name), getattr(full, name), err_msg=name)


def test_cache_blocks_read_the_filled_cache_only_and_sample_the_same():
  assert sampling.blocks(5, 24, 0) == [(0, 23, 0)]  # 0: every slot.
  assert sampling.blocks(5, 24, 10) == [(0, 10, 15), (10, 20, 25), (20, 23, 0)]
  assert sampling.blocks(5, 1, 8) == []
  full = _sample(FULL, 0)
  blocked = _sample(dataclasses.replace(FULL, cache_block=5), 0)
  np.testing.assert_array_equal(blocked.tokens, full.tokens)
  np.testing.assert_allclose(blocked.logprobs, full.logprobs, atol=1e-6)
  # The decode step of a block reads its slots only: a cache_read of 9 slots attends over 9.
  cache, logits = sampling.prefill(PARAMS, PROMPTS, MASK, CFG, 8)
  step = lambda read: jax.jit(sampling.decode_step, static_argnames=(
      "cfg", "scfg", "prompt_len", "cache_read")).lower(
          PARAMS, cache, logits, jnp.zeros(4, bool), 0, jax.random.key(0), MASK.sum(-1),
          FULL.knobs(), CFG, FULL.program(), 5, read).as_text()
  assert "<4x2x9x8xf32>" in step(9) and "<4x2x9x8xf32>" not in step(0)  # [B, KV, read, Dh]


def test_choose_layout():
  big = ModelConfig(variant="llama", vocab_size=1024, d_model=512, n_layers=4, n_heads=8,
                    n_kv_heads=8, d_ff=1024, max_len=64, dtype="bfloat16")
  choose = lambda block, free=None, platform="tpu", shape=None: parallel_rollout.choose(
      {**AUTO, **block}, big, shape or {"data": 1, "fsdp": 8, "tensor": 1}, platform=platform,
      fast_domain=4, rows=16, length=64, free_bytes=free)
  cpu = choose({}, platform="cpu")
  assert (cpu.data, cpu.fsdp, cpu.tensor, cpu.dtype) == (8, 1, 1, "bfloat16")
  host = choose({"mesh": "auto"})
  assert (host.data, host.fsdp, host.tensor) == (2, 1, 4)  # One host's 4 chips, 2 replicas.
  need4 = (parallel_rollout.weight_bytes(big, 4, "bfloat16")
           + parallel_rollout.cache_bytes(big, 16, 64, 2, 4))
  need8 = (parallel_rollout.weight_bytes(big, 8, "bfloat16")
           + parallel_rollout.cache_bytes(big, 16, 64, 1, 8))
  assert need8 < need4
  wide = choose({}, free=(need4 + need8) / 2)  # Widened until it fits.
  assert (wide.data, wide.tensor) == (1, 8) and "widened" in wide.reason
  assert "does not fit" in choose({}, free=need8 / 2).reason
  # One kv head: past tensor=1 every device holds its rows' whole cache, and more rows per replica
  # as tensor grows; with a long cache that outweighs the weights saved.
  one_kv = parallel_rollout.choose(AUTO, dataclasses.replace(big, n_kv_heads=1),
                                   {"data": 8, "fsdp": 1, "tensor": 1},
                                   platform="gpu", fast_domain=8, rows=64, length=4096,
                                   free_bytes=None)
  assert one_kv.tensor == 1 and "fewest bytes" in one_kv.reason
  train = choose({"mesh": "train", "dtype": "auto"})
  assert (train.data, train.fsdp, train.tensor, train.dtype) == (1, 8, 1, "float32")
  explicit = choose({"mesh": "data=-1,tensor=2", "dtype": "float32"})
  assert (explicit.data, explicit.tensor, explicit.dtype) == (4, 2, "float32")
  for bad in ("tensor=3", "pipeline=2", "data=2,tensor=2", "fast"):
    with pytest.raises(ConfigError, match="rollout.mesh"):
      choose({"mesh": bad})
  with pytest.raises(ConfigError, match="rollout.dtype"):
    choose({"dtype": "bf17"})
  # Checked before any work.
  parallel_rollout.check({"mesh": "data=2,tensor=4", "dtype": "auto"}, big, 8)
  with pytest.raises(ConfigError, match="rollout.mesh"):
    parallel_rollout.check({"mesh": "data=2,tensor=2", "dtype": "auto"}, big, 8)
  # Per device: bf16 weights split 4 ways (vocabulary, heads, MLP units) and the KV cache.
  per_layer = 3 * 512 * 1024 / 4 + 4 * 512 * 64 * 8 / 4
  assert parallel_rollout.weight_bytes(big, 4, "bfloat16") == 2 * (4 * per_layer + 1024 * 512 / 4)
  assert parallel_rollout.cache_bytes(big, 16, 64, 2, 4) == 2 * 4 * 8 * 2 * 64 * 64 * 2


def test_reshard_casts_matmul_weights_keeps_norms_and_copies_once():
  cfg = dataclasses.replace(CFG, dtype="bfloat16")
  mesh = make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
  layout = parallel_rollout.choose(AUTO, cfg, dict(mesh.shape), platform="cpu", fast_domain=1, rows=4,
                          length=29, free_bytes=None)
  axes = transformer.param_axes(cfg)
  copy = parallel_rollout.reshard(PARAMS, axes, layout, parallel_rollout.mesh(layout, mesh.devices))
  assert copy["layers"]["attn"]["q"].dtype == jnp.bfloat16
  assert copy["embed"]["embedding"].dtype == jnp.bfloat16
  assert copy["final_norm"]["scale"].dtype == jnp.float32
  assert copy["layers"]["mlp_norm"]["scale"].dtype == jnp.float32
  # No new copy.
  assert parallel_rollout.reshard(copy, axes, layout, parallel_rollout.mesh(layout, mesh.devices)) is copy
  # The bf16 copy samples exactly what the float32 weights sample under bf16 compute.
  scfg = dataclasses.replace(FULL, max_new_tokens=6)
  got, want = (jax.tree.map(np.asarray, sampling.sample(p, PROMPTS, MASK, jax.random.key(3), cfg,
                                                        scfg)) for p in (copy, PARAMS))
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.logprobs, want.logprobs)
