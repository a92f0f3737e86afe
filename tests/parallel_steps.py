"""Runs SFT, reward-model, PPO, DPO, SimPO, KTO, RLOO, GRPO, REINFORCE++ and online DPO training
steps on meshes of 8 forced CPU devices and writes, per mesh, the losses and final parameters
(`<out>/<mesh>.npz`) and byte counts (`<out>/bytes.json`). Every algorithm runs on one device and
on the mesh that uses all three axes (2x2x2); pure data parallelism runs SFT and PPO, pure FSDP SFT
(the suite's time is shared). Each step is its method's program, built by the method's
`program(exp)` (the one its training loop runs) from the tiny config with the blocks of BLOCKS.
The policy also samples in the rollout layouts of ROLLOUTS (parallel/rollout.py: the weights copied
out of the trainer's layout), written as `rollout/<layout>/...` beside each mesh's results.

Started by tests/test_parallel.py in its own process, because the device count is fixed when JAX
starts: `python tests/parallel_steps.py OUT_DIR`.
"""

import os
import sys

# The suite's XLA flags (tests/conftest.py) are kept.
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""),
                                    "--xla_force_host_platform_device_count=8"]).strip()

import functools  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rlhfjax import config_file  # noqa: E402
from rlhfjax.algorithms import dpo, grpo, kto, online, online_dpo, ppo, reinforce_pp  # noqa: E402
from rlhfjax.algorithms import reward_model, rloo, sft  # noqa: E402
from rlhfjax.models.config import ModelConfig  # noqa: E402
from rlhfjax.models import heads, lora, sampling, transformer  # noqa: E402
from rlhfjax.models import sharding_rules  # noqa: E402
from rlhfjax.parallel.mesh import make_mesh  # noqa: E402
from rlhfjax.parallel import rollout as parallel_rollout  # noqa: E402
from rlhfjax.parallel.sharding import Parallel, bytes_per_device, to_host  # noqa: E402
from rlhfjax.stages import memory  # noqa: E402
from rlhfjax.training import experiment, loaders  # noqa: E402
from rlhfjax.training.state import TrainState  # noqa: E402

ALGORITHMS = ("sft", "rm", "ppo", "dpo", "simpo", "kto", "rloo", "grpo", "dapo_gspo",
              "reinforce_pp", "online_dpo")
MESHES = {(1, 1, 1): ALGORITHMS, (2, 2, 2): ALGORITHMS, (8, 1, 1): ("sft", "ppo"),
          (1, 8, 1): ("sft",)}
ROOT = pathlib.Path(__file__).resolve().parent.parent
CFG = ModelConfig(variant="gpt2", vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4,
                  d_ff=64, max_len=32)
B, P, R, STEPS = 8, 8, 8, 3
# Rollout layouts each mesh samples in ('auto' on a CPU: every device a replica).
ROLLOUTS = {(1, 1, 1): ("auto",), (2, 2, 2): ("auto", "data=-1,tensor=2"), (1, 8, 1): ("auto",)}
# eps well above float32 rounding of the gradients, so Adam does not blow a last-bit difference in
# a near-zero gradient up to a full step (the comparison is of the sharding, not of Adam's noise).
OPT = dict(lr=1e-3, warmup_steps=0, schedule="constant", end_lr_frac=1.0, b1=0.9, b2=0.95,
           eps=1e-4, weight_decay=0.01, grad_clip=1.0, steps=STEPS, batch_size=B)
ONLINE = dict(**OPT, rollout_batch=B, temperature=0.7, penalize_no_eos=True, no_eos_score=-1.0,
              share_prompt=True, truncated_is=False,
              old_policy="recompute")
# The blocks each method's builder reads: the tiny config's (tests/conftest.py), with the
# optimizer above and each method's settings.
BLOCKS = {
    "format": dict(prompt_len=P, response_len=R),
    "sft": OPT, "rm": dict(OPT, contrast_batch_size=0, likelihood_weight=0.0),
    "ppo": dict(ONLINE, minibatch_size=4, epochs=2, kl_coef=0.05, adaptive_kl=False,
                kl_target=6.0, kl_horizon=10000, gamma=1.0, lam=0.95, whiten="batch",
                cliprange=0.2, cliprange_value=0.2, vf_coef=0.1, value_model="separate",
                frozen_dtype=""),
    "dpo": dict(OPT, beta=0.1, loss_type="sigmoid", label_smoothing=0.0),
    "simpo": dict(OPT, beta=2.0, gamma_beta_ratio=0.5, loss_type="simpo", label_smoothing=0.0),
    "kto": dict(OPT, beta=0.5, desirable_weight=1.0, undesirable_weight=0.8),
    "rloo": dict(ONLINE, k=2, kl_coef=0.05, cliprange=0.2, epochs=2, minibatch_size=4,
                 normalize_advantages=False),
    "grpo": dict(ONLINE, k=4, beta=0.04, kl_estimator="k3", kl_in="loss", cliprange=0.2,
                 cliprange_high=0.2, scale_rewards="group", loss_type="grpo", epochs=2,
                 minibatch_size=4, overlong_buffer=0, dynamic_sampling=False,
                 importance_sampling_level="token"),
    # Every part DAPO and GSPO add to the GRPO step, in one program (the dapo block): the
    # sequence-level ratio, Clip-Higher, the token-level loss, overlong shaping and dynamic
    # sampling's dropped rows.
    "dapo": dict(ONLINE, k=4, beta=0.0, kl_estimator="k3", kl_in="loss", cliprange=0.2,
                 cliprange_high=0.28, scale_rewards="group", loss_type="bnpo", epochs=2,
                 minibatch_size=4, overlong_buffer=2, overlong_penalty_factor=1.0,
                 dynamic_sampling=True, importance_sampling_level="sequence"),
    "reinforce_pp": dict(ONLINE, k=2, advantage_estimator="reinforce_pp_baseline", kl_coef=0.01,
                         gamma=1.0, cliprange=0.2, epochs=2, minibatch_size=4),
    "online_dpo": dict(ONLINE, beta=0.1, loss_type="sigmoid", label_smoothing=0.0),
}
CONFIG = config_file.load(os.path.join(ROOT, "configs", "tldr_sim.py"), "tiny")
with CONFIG.unlocked():
  for block, values in BLOCKS.items():
    CONFIG[block].update(values)
EOS = experiment.eos_ids(CONFIG)[0]  # The run's: the data's responses end with it.
SAMPLING = sampling.SamplingConfig(max_new_tokens=R, eos_id=EOS, pad_id=0, temperature=1.0,
                                   cache_block=3)
# Each critic-free method's builder and the loss it reports.
CRITIC_FREE = {
    "rloo": (rloo.program, "loss/policy_avg"), "grpo": (grpo.program, "loss/policy_avg"),
    "dapo_gspo": (functools.partial(grpo.program, task="dapo"), "loss/policy_avg"),
    "reinforce_pp": (reinforce_pp.program, "loss/policy_avg"),
    "online_dpo": (online_dpo.program, "loss/dpo"),
}


def batches(rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
  """STEPS batches with left-padded prompts, responses ending at an eos, a rejected twin, and
  KTO's labels (two of three rows desirable)."""
  out = []
  for _ in range(STEPS):
    # Groups of 4 rows share a prompt (so groups of 2 do too), as the rollout engine lays them out.
    plen = np.repeat(rng.integers(3, P + 1, B // 4), 4)
    rlen = rng.integers(2, R + 1, B)
    prompt_mask = np.arange(P)[None] >= (P - plen)[:, None]
    prompt = np.repeat(rng.integers(3, CFG.vocab_size, (B // 4, P)), 4, 0)
    response_mask = np.arange(R)[None] < rlen[:, None]
    response = rng.integers(3, CFG.vocab_size, (B, R)) * response_mask
    response[np.arange(B), rlen - 1] = EOS
    rejected = np.where(response_mask, rng.integers(3, CFG.vocab_size, (B, R)), 0)
    out.append({"prompt": prompt * prompt_mask,
                "prompt_mask": prompt_mask, "response": response, "response_mask": response_mask,
                "chosen": response, "chosen_mask": response_mask, "rejected": rejected,
                "rejected_mask": response_mask, "label": np.arange(B) % 3 != 0})
  return out


def experiment_on(par: Parallel) -> experiment.Experiment:
  """The Experiment the methods' builders read: CONFIG, the model CFG on `par`'s mesh, no LoRA."""
  return experiment.Experiment(CONFIG, "", {}, None, CFG, par, "", lora.LoraConfig())


def run(par: Parallel, data: list[dict[str, np.ndarray]], init: dict,
        algorithms: tuple[str, ...]) -> tuple[dict, dict]:
  """Losses and final parameters of STEPS steps of each of `algorithms` on `par`'s mesh, all
  starting from the host parameters `init` ('policy', 'rm'); each step is its method's program
  (`program(exp)`, the one its training loop runs)."""
  key = jax.random.key(0)
  exp = experiment_on(par)
  policy_axes, rm_axes = transformer.param_axes(CFG), heads.param_axes(CFG)
  losses, params = {}, {}
  rows = lambda d, keys: par.put_batch({k: d[k] for k in keys}, np.arange(B))
  lm_keys = ("prompt", "prompt_mask", "response", "response_mask")
  pair_keys = ("prompt", "prompt_mask", "chosen", "chosen_mask", "rejected", "rejected_mask")
  ref = par.put(init["policy"], par.shardings(policy_axes, init["policy"]))
  rm = par.put(init["rm"], par.shardings(rm_axes, init["rm"]))
  fresh = lambda prog: prog.init(lambda p: TrainState.create(p, prog.tx), ref)

  # SFT.
  prog = sft.program(exp)
  state = fresh(prog)
  for i, d in enumerate(data):
    state, m = prog.step(state, rows(d, lm_keys), jax.random.fold_in(key, i))
    losses.setdefault("sft", []).append(float(m["train/loss"]))
  params["sft"] = to_host(state.params)
  bytes_ = {"sft_params": bytes_per_device(state.params),
            "sft_opt_state": bytes_per_device(state.opt_state)}

  if "rm" in algorithms:
    prog = reward_model.program(exp, STEPS, B)
    state = prog.init(lambda p: TrainState.create(p, prog.tx), rm)
    for d in data:
      state, m = prog.step(state, rows(d, pair_keys))
      losses.setdefault("rm", []).append(float(m["train/loss"]))
    params["rm"] = to_host(state.params)

  if "ppo" in algorithms:  # Policy, value (from the reward model), frozen reference and RM.
    prog = ppo.program(exp)
    state = prog.init(functools.partial(ppo.init_state, exp, lcfg=exp.lora), ref, rm)
    for i, d in enumerate(data):
      state, m = prog.step(state, ref, rm, rows(d, lm_keys), jax.random.fold_in(key, 10 + i))
      losses.setdefault("ppo", []).append(float(m["loss/total"]))
    params["ppo"] = to_host(state.params)

  # DPO from and against the reference, SimPO from it without it, KTO against it on single
  # labelled responses.
  offline = {"dpo": (lambda: dpo.program(exp, "dpo", STEPS), pair_keys),
             "simpo": (lambda: dpo.program(exp, "simpo", STEPS), pair_keys),
             "kto": (lambda: kto.program(exp, STEPS), lm_keys + ("label",))}
  for name, (build, keys) in offline.items():
    if name not in algorithms:
      continue
    prog = build()
    state = prog.init(loaders.policy_init(exp, prog.tx), ref)
    reference = None if prog.args[1] is None else ref
    for d in data:
      state, m = prog.step(state, reference, rows(d, keys))
      losses.setdefault(name, []).append(float(m["train/loss"]))
    params[name] = to_host(state.params)

  # The critic-free online methods: policy {'policy'} from the reference, frozen reward model.
  for name, (build, loss_key) in CRITIC_FREE.items():
    if name not in algorithms:
      continue
    prog = build(exp)
    state = prog.init(online.policy_init(exp, prog.tx), ref)
    for i, d in enumerate(data):
      state, m = prog.step(state, ref, rm, rows(d, lm_keys), jax.random.fold_in(key, 20 + i))
      losses.setdefault(name, []).append(float(m[loss_key]))
    params[name] = to_host(state.params)

  p = memory.param_bytes(CFG, par.mesh)
  bytes_.update(params_total=p["total"], plan_params=p["per_device"],
                xla_params=memory.xla_param_bytes(ref, par.shardings(policy_axes, ref)),
                sft_params_total=sum(x.nbytes for x in jax.tree.leaves(params["sft"])))
  return {"losses": losses, "params": params}, bytes_


def sample_rollouts(par: Parallel, data: list[dict[str, np.ndarray]], init: dict,
                    layouts: tuple[str, ...]) -> dict[str, np.ndarray]:
  """The policy `init['policy']`, placed in `par`'s training layout, copied into each rollout
  layout and sampled on the first batch's prompts: tokens, log-probs and lengths per layout."""
  axes = transformer.param_axes(CFG)
  trained = par.put(init["policy"], par.shardings(axes, init["policy"]))
  out = {}
  for spec in layouts:
    layout = parallel_rollout.choose({"mesh": spec, "dtype": "auto"}, CFG, dict(par.mesh.shape),
                                     platform="cpu", fast_domain=8, rows=B, length=P + R,
                                     free_bytes=None)
    mesh = parallel_rollout.mesh(layout, par.mesh.devices)
    params = parallel_rollout.reshard(trained, axes, layout, mesh)
    rows = lambda x, mesh=mesh: jax.device_put(x, jax.sharding.NamedSharding(
        mesh, sharding_rules.spec(("batch", None), x.shape, mesh)))
    with jax.set_mesh(mesh):
      got = sampling.sample(params, rows(data[0]["prompt"]), rows(data[0]["prompt_mask"]),
                            jax.random.key(7), CFG, SAMPLING)
    for name, value in got._asdict().items():
      out[f"rollout/{spec}/{name}"] = to_host(value)
  return out


def main(out: str) -> None:
  data = batches(np.random.default_rng(0))
  key = jax.random.key(0)
  init = to_host({"policy": transformer.init(key, CFG), "rm": heads.init(jax.random.fold_in(key, 1),
                                                                          CFG)})
  report = {}
  for shape, algorithms in MESHES.items():
    name = "x".join(map(str, shape))
    par = Parallel(make_mesh(dict(zip(("data", "fsdp", "tensor"), shape))))
    result, report[name] = run(par, data, init, algorithms)
    flat = {f"loss/{k}": np.array(v) for k, v in result["losses"].items()}
    flat.update(sample_rollouts(par, data, init, ROLLOUTS.get(shape, ())))
    for algo, tree in result["params"].items():
      for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        flat[f"params/{algo}/{jax.tree_util.keystr(path)}"] = leaf
    np.savez(os.path.join(out, f"{name}.npz"), **flat)
  with open(os.path.join(out, "bytes.json"), "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1])
