"""Rematerialisation as a policy per trained model: every policy computes the same loss and
gradients as none; "dots" keeps the projection and MLP matmul outputs and no attention scores, and
sits between none and full in XLA's temporaries and in the memory plan; the config block, the
roles, the compile task's FLOPs, task=memory's table and the resume rule."""

import collections
import contextlib
import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import ad_checkpoint

from conftest import load_config
from rlhfjax import config_check
from rlhfjax.errors import ConfigError
from rlhfjax.models.config import REMAT, ModelConfig
from rlhfjax.models import flops
from rlhfjax.models import transformer
from rlhfjax.parallel.sharding import Parallel
from rlhfjax.stages import costs
from rlhfjax.stages import memory
from rlhfjax.training import experiment
from rlhfjax.training import loop

# Small, but with the layer scan's stacked residuals clearly above one layer's working set (256
# tokens, 4 scanned layers). Unrolled, 2 layers: compile time grows with them.
B, T = 4, 64
MODELS = {
    "gpt2": ModelConfig(variant="gpt2", vocab_size=64, d_model=32, n_layers=4, n_heads=4,
                        n_kv_heads=4, d_ff=96, max_len=T, dropout=0.1),
    "llama": ModelConfig(variant="llama", vocab_size=64, d_model=64, n_layers=4, n_heads=4,
                         n_kv_heads=2, d_ff=256, max_len=T),
}


def _batch():
  tokens = np.random.default_rng(1).integers(0, 64, (B, T), dtype=np.int32)
  mask = np.arange(T)[None, :] >= np.array([0, 5, 17, 40])[:, None]  # Left padding.
  return tokens, mask


def _loss(params, tokens, mask, cfg):
  """Mean next-token NLL over real tokens, with dropout (gpt2) drawn inside the layers (from an
  "rbg" key: it compiles faster than threefry)."""
  rng = jax.random.key(2, impl="rbg")
  hidden, _ = transformer.forward(params, tokens, cfg, mask=mask, dropout_rng=rng)
  logp = jax.nn.log_softmax(transformer.lm_logits(params, hidden[:, :-1], cfg))
  nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
  m = mask[:, 1:] & mask[:, :-1]
  return jnp.where(m, nll, 0.0).sum() / m.sum()


# XLA's HLO passes as always (the program, and so its buffers, are a training step's); the CPU's
# cheapest code generation cuts the compile time of these tests by two thirds.
_init = jax.jit(transformer.init, static_argnums=1)
_loss_and_grads = jax.jit(jax.value_and_grad(_loss), static_argnums=3,
                          compiler_options={"xla_backend_optimization_level": 0,
                                            "xla_llvm_disable_expensive_passes": True,
                                            "xla_cpu_use_fusion_emitters": False})


# gpt2 (dropout) through the layer scan, llama (GQA, SwiGLU) unrolled: both ways a layer runs.
@pytest.mark.parametrize("variant,scan", [("gpt2", True), ("llama", False)],
                         ids=["gpt2-scanned", "llama-unrolled"])
def test_every_policy_gives_the_loss_and_gradients_of_none(variant, scan):
  """Same math, recomputed (gpt2's dropout masks too): the float32 loss is bit-identical and every
  gradient within 1.3e-7 of the largest one (bit-identical under XLA's default CPU code
  generation); the tolerance is 1e-6 of it."""
  base = MODELS[variant].replace(scan_layers=scan, n_layers=4 if scan else 2)
  params = _init(jax.random.key(0), base)
  tokens, mask = _batch()
  want_loss, want_grads = _loss_and_grads(params, tokens, mask, base)
  atol = 1e-6 * max(np.abs(g).max() for g in jax.tree.leaves(want_grads))
  for remat in REMAT[1:]:
    loss, grads = _loss_and_grads(params, tokens, mask, base.replace(remat=remat))
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6, err_msg=remat)
    jax.tree.map(lambda g, w, r=remat: np.testing.assert_allclose(g, w, rtol=1e-6, atol=atol,
                                                                   err_msg=r),
                 grads, want_grads)


def _residual_shapes(cfg):
  """Shapes of what the backward pass of `_loss` keeps from the forward (as JAX prints them),
  those it keeps in host memory marked ("host", *shape)."""
  params = jax.eval_shape(lambda: transformer.init(jax.random.key(0), cfg))
  tokens, mask = _batch()
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    ad_checkpoint.print_saved_residuals(lambda p: _loss(p, tokens, mask, cfg), params)
  return [("host",) * bool(host) + tuple(int(n) for n in dims.split(",") if n)
          for host, dims in re.findall(r"^\w+(<host>)?\[([\d,]*)\]", out.getvalue(), re.M)]


def test_dots_keeps_the_matmul_outputs_and_no_attention_scores():
  base = MODELS["llama"]
  L, H, KV, F = base.n_layers, base.n_heads, base.n_kv_heads, base.d_ff
  dh = base.dim_per_head
  q, kv, mlp = (L, B, T, H, dh), (L, B, T, KV, dh), (L, B, T, F)
  scores = (L, B, KV, H // KV, T, T)  # The reference kernel's [B, KV, group, T, S] per layer.
  shapes = {r: _residual_shapes(base.replace(remat=r)) for r in REMAT}
  assert scores in shapes["none"]
  # Full: each layer's input only, no stacked per-layer matmul output.
  assert not {q, kv, mlp, scores} & set(shapes["full"])
  # Dots: q once, k and v, the MLP's gate and input projections; the scores are recomputed.
  assert shapes["dots"].count(q) == 1 and shapes["dots"].count(kv) == 2
  assert shapes["dots"].count(mlp) == 2 and scores not in shapes["dots"]
  # Offload: the same outputs, in host memory; on the device what full keeps.
  offload = collections.Counter(shapes["offload"])
  host = collections.Counter({s[1:]: n for s, n in offload.items() if s[:1] == ("host",)})
  assert host == collections.Counter(shapes["dots"]) - collections.Counter(shapes["full"])
  assert offload - collections.Counter({("host",) + s: n for s, n in host.items()}) == \
      collections.Counter(shapes["full"])


def test_xla_temporaries_order_none_dots_full_and_forward_is_unchanged():
  """The compiled training step's temporaries: none > dots > full. A forward without a backward
  pass compiles to the same program under every policy (so sampling, scoring and the reference
  may run under any)."""
  base = MODELS["llama"]
  params = jax.eval_shape(lambda: transformer.init(jax.random.key(0), base))
  tokens, mask = _batch()
  temps = {r: _loss_and_grads.lower(params, tokens, mask, base.replace(remat=r)).compile()
           .memory_analysis().temp_size_in_bytes for r in ("none", "full", "dots")}
  assert temps["none"] > 1.5 * temps["dots"] and temps["dots"] > 1.2 * temps["full"], temps
  forward = jax.jit(lambda p, c: transformer.forward(p, tokens, c, mask=mask)[0], static_argnums=1)
  programs = {r: forward.lower(params, base.replace(remat=r)).as_text(debug_info=False)
              for r in REMAT}
  assert all(text == programs["none"] for text in programs.values())


def test_model_remat_takes_names_only_and_names_bad_values():
  for value in (True, False, "True"):  # "True": as --config.model.remat=True arrives.
    with pytest.raises(ConfigError, match=r"model\.remat must be one of .*by name.*'full'"):
      ModelConfig(remat=value)
  assert ModelConfig().replace(remat="dots").remat == "dots"
  with pytest.raises(ConfigError, match=r"model\.remat must be one of .*'dots'.*got 'some'"):
    ModelConfig(remat="some")


def test_offload_needs_pinned_host_memory(monkeypatch):
  cfg = MODELS["llama"].replace(remat="offload")
  assert callable(transformer.checkpointed(lambda x: x, cfg))  # This CPU has pinned_host.

  class Device:
    def addressable_memories(self):
      return [type("Memory", (), {"kind": "device"})()]

  monkeypatch.setattr(jax, "devices", lambda *a: [Device()])
  with pytest.raises(ConfigError, match=r"model\.remat='offload' needs .*pinned_host"):
    transformer.checkpointed(lambda x: x, cfg)


def _experiment(config):
  cfg = ModelConfig.from_mapping(config.model.to_dict())
  return experiment.Experiment(config, "", {}, None, cfg, Parallel.from_config(config.mesh))


def test_each_role_trains_under_its_own_policy(tiny_config):
  config = tiny_config
  config_check.check(config)  # String leaves in the new block pass the range checks.
  config.model.remat = "full"
  config.remat.update(policy="dots", value="offload")
  exp = _experiment(config)
  assert {r: exp.model_for(r).remat for r in ("sft", "rm", "policy", "value")} == \
      {"sft": "full", "rm": "full", "policy": "dots", "value": "offload"}
  assert exp.model_for("policy") == exp.model.replace(remat="dots")  # Nothing else changes.
  assert exp.remat_meta("policy", "value") == {"remat": {"policy": "dots", "value": "offload"}}
  config.remat.critic = "dots"
  with pytest.raises(ConfigError, match=r"remat\.critic: unknown model role"):
    experiment.remat_policies(config)
  del config.remat["critic"]
  config.remat.rm = "all"
  with pytest.raises(ConfigError, match=r"remat\.rm must be .*got 'all'"):
    exp.model_for("sft")


def test_resume_may_switch_remat_but_not_the_model():
  model = {"d_model": 32, "remat": False, "lr": 1.0}
  stored = {"model": model, "remat": {"policy": "none", "value": "none"}, "ppo": {"steps": 3}}
  now = {"model": {**model, "remat": "dots"}, "remat": {"policy": "dots", "value": "full"},
         "ppo": {"steps": 3}}
  changed, refused = loop.meta_differences(stored, now)
  assert refused == []
  assert changed == ["model.remat: False -> 'dots'", "remat.policy: 'none' -> 'dots'",
                     "remat.value: 'none' -> 'full'"]
  # A finished reward model saved before the block existed (reward_model.fit passes None).
  assert loop.meta_differences({"remat": None}, {"remat": {"rm": "dots"}}) == \
      (["remat: None -> {'rm': 'dots'}"], [])
  _, refused = loop.meta_differences(stored, {**now, "model": {**now["model"], "d_model": 64}})
  assert refused == ["model.d_model: 32 -> 64"]


def test_resume_says_which_policy_changed(tmp_path, capsys):
  class Ckpt:
    directory = str(tmp_path)

  loop._check_meta(Ckpt(), {"sft": {"lr": 1.0}, "remat": {"sft": "none"}},
                   {"sft": {"lr": 0.5}, "remat": {"sft": "dots"}})
  out = capsys.readouterr().out
  assert "with changed optimizer settings: sft.lr: 1.0 -> 0.5" in out
  assert "with another rematerialisation policy: remat.sft: 'none' -> 'dots'" in out


def test_memory_plan_orders_none_dots_full():
  cfg = ModelConfig(variant="llama", vocab_size=64, d_model=64, n_layers=4, n_heads=4,
                    n_kv_heads=2, d_ff=256, max_len=512)
  mesh = Parallel.from_config({"data": -1, "fsdp": 1, "tensor": 1}).mesh
  plans = {r: memory.plan(cfg.replace(remat=r), mesh, 2, 512) for r in REMAT}
  act = {r: p["activations"] for r, p in plans.items()}
  assert act["none"] > act["dots"] > act["full"] == act["offload"]
  # Dots keeps per layer and token q (4 x 16), k and v (2 x 2 x 16), the output projection's 64
  # and the MLP's two 256-wide inputs: 704 float32 beyond full; offload keeps them on the host.
  kept = 4 * 2 * 512 * 704 * 4
  assert act["dots"] - act["full"] == kept and plans["offload"]["offloaded"] == kept
  assert plans["dots"]["offloaded"] == 0


def test_compile_counts_what_each_policy_recomputes():
  cfg = ModelConfig(variant="llama", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)
  recomputed = lambda r: costs.recomputed(cfg.replace(remat=r), 2, 32)
  assert recomputed("none") == 0
  assert recomputed("full") == flops.forward(cfg, 2, 32, logit_tokens=0)
  # Dots and offload: the causal half of QK^T and PV, 2 x 2 FLOPs per multiply-add, per layer.
  scores = 4 * 2 * 32 * 32 * cfg.n_heads * cfg.dim_per_head * cfg.n_layers // 2
  assert recomputed("dots") == recomputed("offload") == scores


def test_memory_task_shows_each_trained_model_under_every_policy(tiny_config, tmp_path,
                                                                 monkeypatch, capsys):
  config = tiny_config
  config.remat.update(policy="dots", value="offload")
  # The XLA compiles of the SFT and PPO steps are test_lora's; here only the plan's tables.
  monkeypatch.setattr(memory, "xla_step_bytes", lambda _: dict.fromkeys(
      ("arguments", "outputs", "temporaries", "aliased"), 0))
  held = dict.fromkeys(("trained_params", "params", "policy_and_value", "optimizer", "reference",
                        "reward_model", "held"), 0)
  monkeypatch.setattr(memory, "ppo_held", lambda *a: {**held, "xla_ppo_step": dict.fromkeys(
      ("arguments", "temporaries"), 0)})
  report = memory.run(config, str(tmp_path))
  assert {k: r["remat"] for k, r in report["remat"].items()} == {
      "sft (sft step)": "none", "rm (rm step)": "none", "policy (ppo update)": "dots",
      "value (ppo update)": "offload"}
  out = capsys.readouterr().out
  assert "| model (step) | remat | none | full | dots | offload |" in out
  assert "| policy (ppo update) | dots |" in out and "host) |" in out
  # The PPO rows of the plan are the policy's: its dots activations.
  assert report["plans"]["ppo rollout"]["activations"] == \
      report["remat"]["policy (ppo update)"]["costs"]["dots"]["activations"]


@pytest.mark.parametrize("name,arg,want", [("tldr_scale", "smollm2-135m", "full"),
                                           ("tldr_sim", "tiny", "none")])
def test_shipped_configs_name_their_policy(name, arg, want):
  config = load_config(name, arg)
  assert config.model.remat == want and dict(config.remat) == dict.fromkeys(
      ("sft", "rm", "policy", "value"), "")
