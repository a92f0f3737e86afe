"""task=compile under rollout.placement='split': the slice divided into disjoint trainer and
sampler chips, the push compiled over their union with its bytes counted from the HLO, and the
asynchronous iteration max(generation, training) + push."""

import jax
import pytest

from conftest import load_config
from rlhfjax.errors import ConfigError
from rlhfjax.parallel import tpu
from rlhfjax.stages import compile as compile_task
from rlhfjax.stages import costs
from rlhfjax.stages import split

pytestmark = pytest.mark.filterwarnings(
    "ignore:Error reading persistent compilation cache entry:UserWarning")

needs_libtpu = pytest.mark.skipif(not tpu.has_libtpu(), reason="needs pip install -e '.[tpu]'")


def split_config():
  """A one-layer LLaMA (the value head on the policy's trunk, one epoch: a quick update) on
  v5e:2x4, half the chips sampling at tensor=2; a quarter is also tried (6 trainer chips: the
  rollout batch of 8 does not divide over them)."""
  c = load_config()
  c.model.update(variant="llama", n_layers=1, n_kv_heads=1, dtype="bfloat16")
  c.ppo.update(epochs=1, minibatch_size=8, value_model="policy_trunk")
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  c.rollout.update(placement="split", sampler_share=0.5, mesh="data=2,tensor=2")
  c.compile.update(topology="v5e:2x4", steps="", split_shares="0.25", auto_candidates=1)
  return c


@needs_libtpu
def test_split_compiles_on_disjoint_chips_and_pushes_the_bf16_policy(tmp_path):
  c = split_config()
  cfg = compile_task.model_config(c)
  devices = tpu.devices("v5e:2x4")
  # The programs' chips: the update on the first four, the rollout on the last four.
  par, steps, _ = compile_task.split_steps(c, cfg, devices[:4], devices[4:], 15 * 2**30)
  named = {s.name: s for s in steps}
  trainer = {d for x in jax.tree.leaves(named["ppo_update"].args) for d in x.sharding.device_set}
  sampler = set(named["ppo_decode"].mesh.devices.flat)
  assert trainer == set(par.mesh.devices.flat) == set(devices[:4])
  assert set(named["ppo_prefill"].mesh.devices.flat) == sampler == set(devices[4:])
  assert set(named[compile_task.PUSH].mesh.devices.flat) == trainer | sampler == set(devices)

  report = compile_task.run(c, str(tmp_path))["v5e:2x4"]["async"]
  best, quarter = report["candidates"]
  assert (best["sampler"], best["trainer"]) == (4, 4) and report["best"] == 0
  assert "ppo.rollout_batch=8" in quarter["error"] and "rows" not in quarter
  assert best["layout"]["tensor"] == 2 and best["layout"]["dtype"] == "bfloat16"
  assert best["fits"] and report["colocated_s"] is None  # No colocated steps asked for.
  # The policy by hand: the matmul weights in bfloat16 (the one kv head's k and v unsplit by
  # tensor), the norm scales (final, attention, MLP) in float32.
  d, f, v, dh, h = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.dim_per_head, cfg.n_heads
  matmuls, norms = 2 * (v * d + 2 * d * h * dh + 2 * d * dh + 3 * d * f), 4 * 3 * d
  # One copy crosses from the trainer's chips to the sampler's (the HLO's collective-permutes).
  assert best["push_bytes"] == matmuls + norms
  # Each sampler chip receives at least its slice (vocabulary, query heads and MLP units split
  # in two); the push's time is what a chip receives over ICI.
  push = best["rows"][compile_task.PUSH]
  slice_ = 2 * (v * d / 2 + 2 * d * h * dh / 2 + 2 * d * dh + 3 * d * f / 2) + norms
  assert push["ici_bytes"] == best["push_received_bytes"] >= slice_
  assert push["time_s"] == pytest.approx(push["ici_bytes"] / tpu.CHIPS["v5e"].ici_bandwidth)
  rows = best["rows"]
  generation = rows["ppo_prefill"]["time_s"] + costs.decode_seconds(
      rows["ppo_decode"], c, tpu.CHIPS["v5e"].hbm_bandwidth)[0]
  assert best["generation_s"] == pytest.approx(generation)
  assert best["training_s"] == rows["ppo_update"]["time_s"]
  assert best["push_s"] == push["time_s"] > 0
  assert best["iteration_s"] == max(best["generation_s"], best["training_s"]) + best["push_s"]
  with open(tmp_path / "compile" / "v5e_2x4.md", encoding="utf-8") as out:
    assert "| 4/8 | 4 / 4 | (1, 4, 1) | (2, 1, 2) bfloat16 |" in out.read()


def test_split_shares_are_checked():
  c = split_config()
  assert split.sampler_counts(c, 8) == [4, 2]
  c.compile.split_shares = "0.5,0.75,0.125"  # 4 repeats the sampler_share's; 1 of 8 is a chip.
  assert split.sampler_counts(c, 8) == [4, 6, 1]
  for bad in ("half", "0.01", "1.0"):
    c.compile.split_shares = bad
    with pytest.raises(ConfigError, match="compile.split_shares"):
      split.sampler_counts(c, 8)
  assert split.iteration(2.0, 3.0, 0.5) == 3.5


@needs_libtpu
def test_a_sampler_whose_replicas_cannot_share_the_batch_is_refused():
  """6 sampler chips in replicas of tensor 2: 3 replicas cannot share a rollout's 8 rows (on
  v5p-64, 48 sampler chips at tensor 8 and 64 rows), said before anything compiles."""
  c = split_config()
  c.rollout.mesh = "data=3,tensor=2"
  devices = tpu.devices("v5e:2x4")
  with pytest.raises(ConfigError, match="ppo.rollout_batch=8 does not divide .* 3 devices"):
    compile_task.split_steps(c, compile_task.model_config(c), devices[:2], devices[2:], 2**34)
