"""Asynchronous rollouts (rollout.placement, rollout.max_staleness, <method>.old_policy).

On 8 forced CPU devices, in processes of their own: the sampler on 4 devices and the trainer on 4
with max_staleness=0 equals the colocated run on the trainer's 4 devices bit for bit (metrics,
checkpoints, outputs) for PPO and GRPO; with max_staleness=2 every batch's logged lag is at most 2
and reaches 2; and that run killed by SIGKILL after its first checkpoint (batches in flight) and
relaunched ends as its uninterrupted run. The pieces are checked here on one device."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import chaos  # tests/chaos.py
from rlhfjax.algorithms import online
from rlhfjax.errors import ConfigError
from rlhfjax.parallel import placement
from rlhfjax.training import checkpoint
from rlhfjax.training import loop
from rlhfjax.training.state import TrainState

CONFIG = "configs/tldr_sim.py:tiny"
# GRPO's tiny block samples 2 prompts an iteration; 4 do divide over 4 trainer devices.
STAGES = ("--config.stages=ppo,grpo", "--config.grpo.k=2")
SPLIT = ("--config.rollout.placement=split", "--config.rollout.sampler_share=0.5")
STALE = (*SPLIT, "--config.rollout.max_staleness=2", "--config.checkpoint.every=1")


def _block(**kw):
  return {"mesh": "auto", "placement": "split", "sampler_share": 0.25, **kw}


def test_split_gives_the_trainer_the_first_devices():
  assert placement.split(_block(), list(range(8))) == ([0, 1, 2, 3, 4, 5], [6, 7])
  assert placement.split(_block(sampler_share=0.5), list(range(8))) == ([0, 1, 2, 3],
                                                                         [4, 5, 6, 7])
  assert placement.split(_block(placement="colocated"), list(range(8))) == (list(range(8)), [])


class _Device:
  def __init__(self, process):
    self.process_index = process


def test_a_split_across_processes_is_refused_by_name():
  devices = [_Device(p) for p in range(2) for _ in range(4)]
  with pytest.raises(ConfigError, match="rollout.placement='split' runs in one process"):
    placement.split(_block(), devices)
  assert placement.split(_block(placement="colocated"), devices) == (devices, [])


@pytest.mark.parametrize("block, message", [
    (_block(placement="apart"), "rollout.placement must be one of"),
    (_block(sampler_share=0.05), "rollout.sampler_share=0.05 leaves 0 of 8"),
    (_block(sampler_share=0.95), "leaves 8 of 8 devices to the sampler and 0 to the trainer"),
    (_block(mesh="train"), "rollout.mesh='train'"),
])
def test_bad_placements_are_named(block, message):
  with pytest.raises(ConfigError, match=message):
    placement.split(block, list(range(8)))


@pytest.mark.parametrize("k", [-1, 1.5, True])
def test_bad_staleness_is_named(k):
  with pytest.raises(ConfigError, match="rollout.max_staleness must be a whole number"):
    placement.check_staleness({"max_staleness": k})


def test_old_policy_picks_the_ratio_anchor():
  """'recompute': the trainer's log-probs; 'sampler': the batch's own, hand-set here."""
  recomputed = jnp.array([[-1.0, -2.0]])
  batch = {"sampler_logprobs": jnp.array([[-1.5, -2.5]])}
  c = ml_collections.ConfigDict({"old_policy": "recompute"})
  assert online.old_logprobs(recomputed, batch, c) is recomputed
  c.old_policy = "sampler"
  np.testing.assert_array_equal(online.old_logprobs(recomputed, batch, c), [[-1.5, -2.5]])


@pytest.mark.parametrize("change, message", [
    ({"old_policy": "behaviour"}, "ppo.old_policy must be one of"),
    ({"old_policy": "sampler", "truncated_is": True}, "which is 1 with ppo.old_policy='sampler'"),
])
def test_bad_old_policy_is_named(change, message):
  c = ml_collections.ConfigDict({"truncated_is": False, "old_policy": "recompute"})
  c.update(change)
  with pytest.raises(ConfigError, match=message):
    online.check_old_policy("ppo", c)


def test_a_resume_under_another_staleness_is_refused():
  for old, new in ((1, 2), (2, 0), (0, 1)):  # Synchronous runs record theirs too.
    _, refused = loop.meta_differences(placement.meta(old), placement.meta(new))
    assert refused == [f"async.max_staleness: {old} -> {new}"]


def test_a_checkpoint_whose_batches_in_flight_are_damaged_is_moved_aside(tmp_path):
  """The state of the latest checkpoint reads, its batches sampled ahead do not: the relaunch
  falls back to the checkpoint before, with that one's batches, as for a damaged state."""
  ckpt = checkpoint.Checkpointer(str(tmp_path), every=1)
  fresh = TrainState.create({"w": jnp.zeros(2)}, optax.sgd(0.1))
  for step in (1, 2):
    ckpt.save(step, fresh.replace(step=jnp.asarray(step)), {},
              {str(step + 1): {"version": np.int64(step), "idx": np.arange(2)}})
  ckpt.wait()
  for root, _, files in os.walk(os.path.join(str(tmp_path), "2", "extra")):
    for name in files:
      open(os.path.join(root, name), "wb").close()  # Truncated, as by a full disk.
  state, extra = loop.restore_with_extra(ckpt, fresh)
  assert int(state.step) == 1 and list(extra) == ["2"] and ckpt.all_steps() == [1]


def test_checkpoint_extra_round_trips_and_may_be_absent(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), every=1)
  extra = {"3": {"version": np.int64(1), "idx": np.arange(4),
                 "batch": {"response": np.arange(8, dtype=np.int32).reshape(2, 4)}}}
  ckpt.save(1, {"w": jnp.ones(2)}, {}, extra)
  ckpt.save(2, {"w": jnp.ones(2)}, {})
  ckpt.wait()
  back = ckpt.restore_extra(1)
  assert int(back["3"]["version"]) == 1
  np.testing.assert_array_equal(back["3"]["batch"]["response"], extra["3"]["batch"]["response"])
  assert ckpt.restore_extra(2) is None
  ckpt.close()


def test_push_bytes_count_every_replica():
  x = jax.device_put(jnp.zeros((4, 8), jnp.bfloat16))
  assert placement.bytes_received({"w": x}) == 4 * 8 * 2 * len(x.sharding.device_set)


# --- Whole runs on 8 forced CPU devices -------------------------------------------------------------


def _rows(workdir: str, stage: str) -> list[dict]:
  """Every metrics row of a stage, wall-clock figures included."""
  with open(os.path.join(workdir, stage, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _lags(workdir: str, stage: str) -> list[float]:
  rows = chaos._metrics(os.path.join(workdir, stage, "metrics.jsonl"))  # pylint: disable=protected-access
  return [rows[s]["rollout/version_lag"] for s in sorted(rows) if "rollout/version_lag" in rows[s]]


@pytest.fixture(scope="module")
def eight_devices(tiny_pipeline, tmp_path_factory):
  """The tiny pipeline's SFT, labels and RM copied into four workdirs, each trained further on 8
  CPU devices: `colocated` (mesh data=4: the first 4), `split` (4 sample, 4 train,
  max_staleness=0), `stale` (the same with max_staleness=2, a checkpoint every step) and `killed`
  (`stale` killed by SIGKILL once its first PPO checkpoint is written, then relaunched)."""
  _, source = tiny_pipeline
  root = tmp_path_factory.mktemp("async")
  env = {"XLA_FLAGS": " ".join([os.environ.get("XLA_FLAGS", ""),
                                "--xla_force_host_platform_device_count=8"]).strip(),
         "JAX_PLATFORMS": "cpu"}
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  runs = {"colocated": (*STAGES, "--config.mesh.data=4"), "split": (*STAGES, *SPLIT),
          "stale": (*STAGES, *STALE)}
  dirs = {name: str(root / name) for name in (*runs, "killed")}
  try:
    for name, flags in runs.items():
      chaos.copy_needs(source, dirs[name], "ppo")
      chaos.finish(CONFIG, dirs[name], flags)
    chaos.copy_needs(source, dirs["killed"], "ppo")
    flags = ("--config.stages=ppo", *STALE)
    killed_at = chaos.kill_after_checkpoint(chaos.command(CONFIG, dirs["killed"]) + list(flags),
                                            dirs["killed"], "ppo")
    chaos.finish(CONFIG, dirs["killed"], flags)
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
  yield dirs, killed_at
  shutil.rmtree(root, ignore_errors=True)


def test_split_without_staleness_equals_the_colocated_run(eight_devices):
  dirs, _ = eight_devices
  assert chaos.differences(dirs["colocated"], dirs["split"], only=("ppo", "grpo")) == []
  for stage in ("ppo", "grpo"):  # The split run did push to devices of its own.
    rows = chaos._metrics(os.path.join(dirs["split"], stage, "metrics.jsonl"))  # pylint: disable=protected-access
    assert all("rollout/version_lag" not in r for r in rows.values())
    pushes = [r for r in _rows(dirs["split"], stage) if "perf/push_bytes" in r]
    assert pushes and all(r["perf/push_bytes"] > 0 and r["time/push_s"] > 0 for r in pushes)


def test_stale_batches_are_at_most_max_staleness_old(eight_devices):
  dirs, _ = eight_devices
  assert _lags(dirs["stale"], "ppo") == [0.0, 1.0, 2.0, 2.0]  # 4 iterations.
  assert _lags(dirs["stale"], "grpo") == [0.0, 1.0]  # 2 iterations.
  rows = chaos._metrics(os.path.join(dirs["stale"], "ppo", "metrics.jsonl"))  # pylint: disable=protected-access
  assert "sampling/lag_2/sampling_logp_difference/mean" in rows[3]
  assert all(r["rollout/version_lag_mean"] == r["rollout/version_lag"] for r in rows.values()
             if "rollout/version_lag" in r)  # PPO has no refill: every row of the batch's age.
  # The push is timed only while no draw is in flight: the first iteration's.
  assert [r["step"] for r in _rows(dirs["stale"], "ppo") if "time/push_s" in r] == [1]


def test_an_async_run_killed_with_batches_in_flight_resumes_exactly(eight_devices):
  dirs, killed_at = eight_devices
  assert killed_at is not None, "the PPO run finished before its kill"
  assert chaos.differences(dirs["stale"], dirs["killed"], only=("ppo",)) == []
