"""task=compile: every step compiled for TPU slices on this CPU host (libtpu, no TPU), fit and
no-fit reported from XLA, the rollout in its own layout (no weights gathered per token), the
collectives counted from the HLO, analytic FLOPs against XLA's count of an unscanned model,
mesh.auto, slice names, and a silent libtpu."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from conftest import ROOT, load_config
from rlhfjax.algorithms import sft
from rlhfjax.errors import ConfigError
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import flops, transformer
from rlhfjax.parallel import hlo
from rlhfjax.parallel import tpu
from rlhfjax.stages import compile as compile_task
from rlhfjax.stages import costs
from rlhfjax.training import optimizer
from rlhfjax.training.state import TrainState

# A program compiled for a TPU topology goes into the session's compilation cache (conftest), but a
# process with no TPU client cannot load it back: JAX says so and compiles again, as it would have.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Error reading persistent compilation cache entry:UserWarning")

needs_libtpu = pytest.mark.skipif(not tpu.has_libtpu(), reason="needs pip install -e '.[tpu]'")


@pytest.fixture(scope="module", autouse=True)
def low_effort():
  """This file's TPU compiles at XLA's lowest effort for execution time: a third less CPU time each
  (docs/research/performance_sessions.md). XLA partitions a step the same way at either effort
  (every step of `reports` has the same collectives, in number and bytes) but schedules it with
  less care for memory, so its temporaries differ (a tiny step's per-chip bytes by up to 3 MiB
  either way). These tests check fit, collectives, FLOPs and arguments, none a step's compiled
  bytes; task=compile compiles at XLA's default effort, and so does test_compile_async.py, whose
  push must stay bound by its ICI bytes."""
  before = jax.config.jax_exec_time_optimization_effort
  jax.config.update("jax_exec_time_optimization_effort", -1.0)
  yield
  jax.config.update("jax_exec_time_optimization_effort", before)


# Every step but the critic-free updates, which test_critic_free_updates_compile compiles once.
CORE_STEPS = tuple(s for s in compile_task.STEPS
                   if s.removesuffix("_update") not in compile_task.CRITIC_FREE)


def tiny_llama(**mesh):
  c = load_config()
  c.model.update(variant="llama", n_kv_heads=1)
  c.mesh.update(data=1, fsdp=-1, tensor=1, **mesh)
  return c


# The step also compiled for a v4 slice (another chip, a 3D topology).
V4_STEPS = ("sft",)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
  """The tiny LLaMA (bfloat16 compute) compiled on a v5e slice for every step and on a v4 slice for
  V4_STEPS (compiled once), both written to one workdir."""
  c = tiny_llama()
  c.model.dtype = "bfloat16"
  workdir = str(tmp_path_factory.mktemp("compile"))
  c.compile.update(topology="v5e:2x2", steps=",".join(CORE_STEPS))
  out = compile_task.run(c, workdir)
  c.compile.update(topology="v4:2x2x1", steps=",".join(V4_STEPS))
  return {**out, **compile_task.run(c, workdir)}, workdir


@needs_libtpu
def test_every_step_compiles_and_fits_on_v5e_and_v4(reports):
  out, workdir = reports
  for topology, chip, steps in (("v5e:2x2", "v5e", set(CORE_STEPS)), ("v4:2x2x1", "v4", V4_STEPS)):
    r = out[topology]
    assert r["chips"] == 4 and r["chip"]["name"] == chip and r["mesh"]["fsdp"] == 4
    whole = {compile_task.WHOLE_PPO, compile_task.RESHARD} if "ppo_decode" in steps else set()
    assert set(r["rows"]) == set(steps) | whole
    for name, row in r["rows"].items():
      assert row["fits"] and row["per_chip"] > 0 and row["time_s"] > 0, (topology, name)
      if name != compile_task.RESHARD:  # A copy: no model FLOPs, no tokens.
        assert 0 < row["mfu"] <= 1 and row["tokens_per_s"] > 0 and row["model_flops"] > 0
      assert row["headroom"] > 0
    name = topology.replace(":", "_")
    with open(os.path.join(workdir, "compile", f"{name}.json"), encoding="utf-8") as f:
      assert json.load(f)["rows"]["sft"]["fits"]
    with open(os.path.join(workdir, "compile", f"{name}.md"), encoding="utf-8") as f:
      text = f.read()
    assert "| sft |" in text and f"TPU {chip}" in text
  rows = out["v5e:2x2"]["rows"]
  assert rows["ppo_update"]["arguments"] > rows["sft"]["arguments"]
  # The rollout steps carry the other models and the optimizer state as resident bytes.
  assert rows["ppo_decode"]["resident"] > 0 and rows["sft"]["resident"] == 0


@needs_libtpu
def test_gemma_windows_compile_with_splash(tmp_path):
  """A Gemma 3-style model (window of 16, shorter than the prompt, on five layers of six; q/k norms,
  soft-capped logits) compiles for a v5e slice under splash: training through the scanned layers
  (the local or causal kernel chosen per layer), the rollout's prefill and the decode step reading
  its cache through the window mask."""
  c = tiny_llama()
  c.model.update(n_layers=6, n_kv_heads=1, dtype="bfloat16", attention="splash", qk_norm=True,
                 norm_plus_one=True, sandwich_norm=True, mlp_activation="gelu_tanh",
                 embed_scale=True, final_softcap=30.0, sliding_window=16,
                 sliding_window_pattern=6, rope_local_theta=10000.0)
  c.compile.update(topology="v5e:2x2", steps="sft,ppo_prefill,ppo_decode")
  # A bfloat16 model runs at JAX's default precision (runtime.matmul_precision 'auto'); the test
  # session's blanket 'highest' (conftest) would ask Mosaic for float32 bfloat16 matmuls.
  with jax.default_matmul_precision("default"):
    rows = compile_task.run(c, str(tmp_path))["v5e:2x2"]["rows"]
  for name in ("sft", "ppo_prefill", "ppo_decode"):
    assert rows[name]["fits"] and rows[name]["model_flops"] > 0, name


@needs_libtpu
def test_critic_free_updates_compile(tmp_path):
  """DAPO's, GSPO's and REINFORCE++'s updates (experience and minibatch passes, each under its
  block) compile for v5e:2x2 under fsdp=4 and fit, with their flops and passes counted."""
  c = tiny_llama()
  names = ("dapo_update", "gspo_update", "reinforce_pp_update")
  c.compile.update(topology="v5e:2x2", steps=",".join(names))
  rows = compile_task.run(c, str(tmp_path))["v5e:2x2"]["rows"]
  assert set(rows) == set(names)
  for name in names:
    row = rows[name]
    assert row["fits"] and row["per_chip"] > 0 and 0 < row["mfu"] <= 1, name
    assert row["model_flops"] > 0 and row["tokens_per_s"] > 0, name


def _smallest_weight_bytes(cfg: ModelConfig) -> float:
  """Bytes of the smallest per-layer matmul weight in bfloat16, split 4 ways: anything an
  all-gather of a weight returns on 4 chips is at least this large."""
  return 2 * min(cfg.d_model * cfg.n_kv_heads * cfg.dim_per_head, cfg.d_model * cfg.d_ff) / 4


def _fsdp_split(tree) -> bool:
  return any("fsdp" in jax.tree.leaves(tuple(x.sharding.spec)) for x in jax.tree.leaves(tree))


@needs_libtpu
def test_rollout_decodes_without_gathering_weights(reports, tmp_path):
  """Under fsdp=4 the trainer gathers weights (SFT, PPO update); the rollout's copy (bf16, tensor
  parallel on one host, no fsdp) decodes without gathering any, counted in the compiled HLO.
  rollout.mesh='train' keeps the old decode: the trainer's float32 weights gathered every token."""
  rows = reports[0]["v5e:2x2"]["rows"]
  c = tiny_llama()
  c.model.dtype = "bfloat16"
  cfg = compile_task.model_config(c)
  weight = _smallest_weight_bytes(cfg)
  for name in ("sft", "ppo_update"):
    gathers = rows[name]["collectives"]["all-gather"]
    assert gathers["count"] >= cfg.n_layers and gathers["largest"] >= weight, name
  decode = rows["ppo_decode"]
  assert decode["layout"]["fsdp"] == 1 and decode["layout"]["dtype"] == "bfloat16"
  assert decode["collectives"]["all-gather"]["largest"] < weight
  assert decode["ici_counted"] and decode["cache_read"] > 0
  assert rows[compile_task.RESHARD]["ici_bytes"] > 0
  whole = rows[compile_task.WHOLE_PPO]
  assert whole["decode_roofline_s"] <= whole["decode_s"] < whole["rollout_s"] < whole["time_s"]
  # The steps' arguments, as task=compile lowers them.
  devices = tpu.devices("v5e:2x2")
  par = compile_task.Parallel(compile_task.topology_mesh(devices, reports[0]["v5e:2x2"]["mesh"]))
  built = {s.name: s for s in compile_task.steps(c, cfg, par, ("sft", "ppo_decode", "ppo_update"),
                                                 fast_domain=4)}
  assert _fsdp_split(built["sft"].args[0].params)
  assert _fsdp_split(built["ppo_update"].args[0].params)
  policy = built["ppo_decode"].args[0]
  assert not _fsdp_split(policy)
  matmuls = [x for path, x in jax.tree_util.tree_leaves_with_path(policy)
             if "norm" not in jax.tree_util.keystr(path)]  # Norm scales keep float32.
  assert {x.dtype for x in matmuls} == {jnp.dtype(jnp.bfloat16)}
  # Before: the trainer's layout.
  c.rollout.mesh = "train"
  c.compile.update(topology="v5e:2x2", steps="ppo_decode")
  before = compile_task.run(c, str(tmp_path))["v5e:2x2"]["rows"]
  assert compile_task.RESHARD not in before
  assert before["ppo_decode"]["collectives"]["all-gather"]["largest"] >= weight
  assert before["ppo_decode"]["layout"]["dtype"] == "float32"


@needs_libtpu
def test_decode_does_not_gather_the_cache_when_tensor_exceeds_the_kv_heads(tmp_path):
  """8 query heads and 2 kv heads decoding at tensor = 4: the cache cannot split by kv head, so
  each chip keeps it whole; without the constraint on the updated cache XLA split it the way the
  k/v projections are and gathered it every layer and token (70B on v6e-256: 5 GiB per chip)."""
  c = load_config()
  c.model.update(variant="llama", n_heads=8, d_model=64, n_kv_heads=2, dtype="bfloat16")
  c.compile.update(topology="v5e:2x2", steps="ppo_decode")
  c.rollout.mesh = "data=1,tensor=4"
  decode = compile_task.run(c, str(tmp_path))["v5e:2x2"]["rows"]["ppo_decode"]
  assert decode["layout"]["tensor"] == 4
  assert decode["collectives"]["all-gather"]["count"] == 0, decode["collectives"]
  assert decode["bound"] == "hbm"


def test_collectives_are_counted_from_hlo_text():
  """Async pairs once (bytes from the -done), one channel copied into two fusions once, a while
  body times its trip count (XLA's, or the bound in its condition), tuples every element; bytes
  received by ring algorithms."""
  text = """HloModule m, entry_computation_layout={(f32[1024]{0})->f32[1024]{0}}

%add (a: f32[], b: f32[]) -> f32[] {
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

%body (p: bf16[8,16]) -> bf16[8,64] {
  %ag.3 = bf16[8,64]{1,0} all-gather(bf16[8,16]{1,0} %x), channel_id=3, IOTA
}

%cond2 (p: s32[]) -> pred[] {
  %constant.5 = s32[]{:T(128)} constant(12)
  ROOT %lt = pred[]{:T(512)} compare(%p, %constant.5), direction=LT
}

%body2 (p: f32[16]) -> f32[16] {
  %ar.8 = f32[16]{0} all-reduce(f32[16]{0} %p), channel_id=8, GROUP, to_apply=%add
}

%fused_a (x: bf16[4096,1024]) -> bf16[4096,4096] {
  ROOT %all-gather.1 = bf16[4096,4096]{1,0:T(8,128)(2,1)} all-gather(%x), channel_id=1, MESH
}

%fused_b (x: bf16[4096,1024]) -> bf16[4096,4096] {
  ROOT %all-gather.2 = bf16[4096,4096]{1,0:T(8,128)(2,1)} all-gather(%x), channel_id=1, MESH
}

ENTRY %main (p0: bf16[4096,1024]) -> f32[1024] {
  %f1 = bf16[4096,4096]{1,0} fusion(%p0), kind=kCustom, calls=%fused_a
  %f2 = bf16[4096,4096]{1,0} fusion(%p0), kind=kCustom, calls=%fused_b
  %ars = f32[1024]{0} all-reduce-start(f32[1024]{0} %y), channel_id=2, GROUP, to_apply=%add
  %ard = f32[1024]{0} all-reduce-done(f32[1024]{0} %ars)
  %ags = (bf16[2,8]{1,0}, bf16[8,8]{1,0}) all-gather-start(%z), channel_id=5, IOTA
  %agd = bf16[8,8]{1,0} all-gather-done((bf16[2,8]{1,0}, bf16[8,8]{1,0}) %ags)
  %w = (s32[], bf16[8,16]) while(%t), condition=%cond, body=%body, TRIP
  %w2 = (s32[], f32[16]) while(%t2), condition=%cond2, body=%body2
  %rs = (f32[256]{0}, f32[256]{0}) reduce-scatter(%a, %b), channel_id=6, GROUP, to_apply=%add
  ROOT %cp = u32[16]{0} collective-permute(%q), channel_id=7, source_target_pairs={{0,1},{1,0}}
}
""".replace("MESH", "replica_groups=mesh['axis_0'=1,'axis_1'=4] {'axis_1'}").replace(
      "GROUP", "replica_groups={{0,1,2,3}}").replace("IOTA", "replica_groups=[1,4]<=[4]").replace(
          "TRIP", 'backend_config={"known_trip_count":{"n":"32"}}')
  out = hlo.collectives(text, devices=4)
  ops = out["ops"]
  assert ops["all-gather"] == {"count": 1 + 1 + 32, "bytes": 4096 * 4096 * 2 + 8 * 8 * 2
                               + 32 * 8 * 64 * 2, "largest": 4096 * 4096 * 2}
  assert ops["all-reduce"]["count"] == 1 + 12 and ops["all-reduce"]["bytes"] == 4096 + 12 * 64
  assert ops["reduce-scatter"] == {"count": 1, "bytes": 2048, "largest": 2048}
  assert ops["collective-permute"]["bytes"] == 64 and ops["all-to-all"]["count"] == 0
  gathered = (4096 * 4096 * 2 + 128 + 32 * 1024) * 3 / 4
  reduced = 2 * (4096 + 12 * 64) * 3 / 4
  assert out["received"] == pytest.approx(gathered + reduced + 2048 * 3 + 64)


@needs_libtpu
def test_a_step_that_cannot_fit_is_reported_as_not_fitting(tmp_path):
  """Llama-3.1-8B full fine-tuning, batch 64, on one v5e chip: float32 weights and AdamW moments
  alone are 128 GB. XLA refuses the program; the row says so with its numbers."""
  c = load_config("tldr_scale", "llama3.1-8b")
  c.mesh.update(fsdp=1)
  c.compile.update(topology="v5e:1x1", steps="sft")
  row = compile_task.run(c, str(tmp_path))["v5e:1x1"]["rows"]["sft"]
  assert not row["fits"] and row["per_chip"] > 16 * 2**30 and row["headroom"] < 0
  assert row["arguments"] >= 8.03e9 * 12  # Parameters and two moments, float32.
  assert row["model_flops"] == pytest.approx(6 * 8.03e9 * 64 * 2048, rel=0.2)


@needs_libtpu
def test_cheaper_ppo_layouts_hold_fewer_bytes(reports):
  """The value head on the policy's trunk drops a backbone and its AdamW moments; bfloat16 frozen
  models halve the reference and the reward model. Per chip, from the PPO update's sharded
  arguments as task=compile lowers them, uncompiled: the reports compiled the default layout's
  step, and XLA's `arguments` row adds TPU tile padding, most of the bytes of a model this small."""
  devices = tpu.devices("v5e:2x2")
  par = compile_task.Parallel(compile_task.topology_mesh(devices, reports[0]["v5e:2x2"]["mesh"]))
  args = {}
  for value_model, frozen in (("separate", ""), ("policy_trunk", ""), ("policy_trunk", "bfloat16")):
    c = tiny_llama()
    c.model.dtype = "bfloat16"
    c.ppo.update(value_model=value_model, frozen_dtype=frozen)
    step, = compile_task.steps(c, compile_task.model_config(c), par, ("ppo_update",), fast_domain=4)
    args[value_model, frozen] = costs.per_chip(step.args)
  assert args["separate", ""] > args["policy_trunk", ""] > args["policy_trunk", "bfloat16"]


def test_windowed_layers_count_the_scores_inside_their_window():
  """Five local layers of six with a window of 4: at 16 tokens each counts 4²/2 + 12·4 = 56 score
  pairs per head where a global one counts 16²/2 = 128; a decode step over 40 keys 4, not 40;
  without causal_half every layer counts the whole matrix."""
  cfg = ModelConfig(variant="llama", vocab_size=64, d_model=32, n_layers=6, n_heads=4,
                    n_kv_heads=2, d_ff=64, max_len=64, sliding_window=4, sliding_window_pattern=6)
  full = cfg.replace(sliding_window=0)

  def attention(c, tokens, keys=None, causal_half=True):
    matmuls = 2 * tokens * c.n_layers * flops.layer_matmul_params(c)
    return flops.forward(c, 1, tokens, keys=keys, logit_tokens=0,
                         causal_half=causal_half) - matmuls

  assert attention(cfg, 16) == attention(full, 16) * (1 + 5 * 56 / 128) / 6
  assert attention(cfg, 1, keys=40) == attention(full, 1, keys=40) * (1 + 5 * 4 / 40) / 6
  assert attention(cfg, 16, causal_half=False) == attention(full, 16, causal_half=False)


def test_analytic_flops_match_an_unscanned_compile():
  """XLA counts a scanned layer once; unrolled it counts them all, and the formula must agree."""
  c = load_config()
  for variant, kv in (("llama", 2), ("gpt2", 4)):
    cfg = ModelConfig(variant=variant, vocab_size=2048, d_model=256, n_layers=2, n_heads=4,
                      n_kv_heads=kv, d_ff=1024, max_len=512, scan_layers=False)
    tx = optimizer.adamw(c.sft, 10)
    state = jax.eval_shape(lambda cfg=cfg: TrainState.create(transformer.init(jax.random.key(0),
                                                                              cfg), tx))
    b, p, r = 8, 192, 64
    batch = {"prompt": jax.ShapeDtypeStruct((b, p), jnp.int32),
             "prompt_mask": jax.ShapeDtypeStruct((b, p), bool),
             "response": jax.ShapeDtypeStruct((b, r), jnp.int32),
             "response_mask": jax.ShapeDtypeStruct((b, r), bool)}
    step = jax.jit(functools.partial(sft.train_step, cfg=cfg, tx=tx))
    cost = step.lower(state, batch, jax.eval_shape(lambda: jax.random.key(0))).compile()
    cost = cost.cost_analysis()
    xla = (cost[0] if isinstance(cost, list) else cost)["flops"]
    analytic = flops.training(cfg, b, p + r, logit_tokens=r, causal_half=False)
    assert xla == pytest.approx(analytic, rel=0.05), variant
  # Causal halving applies to self-attention only, never to a decode step over a cache.
  cfg = ModelConfig(variant="llama", n_heads=4, n_kv_heads=2)
  full = flops.forward(cfg, 2, 64, causal_half=False)
  attention = 4 * 2 * 64 * 64 * cfg.n_heads * cfg.dim_per_head * cfg.n_layers
  assert full - flops.forward(cfg, 2, 64) == attention // 2
  assert flops.forward(cfg, 2, 1, keys=64) == flops.forward(cfg, 2, 1, keys=64, causal_half=False)


@needs_libtpu
def test_mesh_auto_picks_a_fitting_mesh(tmp_path):
  c = tiny_llama(auto=True)
  c.compile.update(topology="v5e:2x2", steps="sft", auto_candidates=2)
  r = compile_task.run(c, str(tmp_path))["v5e:2x2"]
  shapes = [cand["mesh"] for cand in r["candidates"]]
  assert {"data": 1, "fsdp": 4, "tensor": 1} in shapes
  assert {"data": 1, "fsdp": 2, "tensor": 2} in shapes
  assert sum("rows" in cand for cand in r["candidates"]) == 2
  assert r["fits"] and r["mesh"] in shapes[:2]
  assert all(s["data"] * s["fsdp"] * s["tensor"] == 4 for s in shapes)


def test_mesh_candidates_respect_batches_and_heads():
  c = tiny_llama()
  c.ppo.rollout_batch = 4  # Divides over at most 4 data-parallel chips.
  cfg = compile_task.model_config(c)  # 2 heads: tensor at most 2.
  shapes = compile_task.mesh_candidates(c, cfg, 8)
  assert shapes and all(s["tensor"] <= 2 and s["data"] * s["fsdp"] <= 4 for s in shapes)
  assert {"data": 1, "fsdp": 4, "tensor": 2} in shapes


def test_topologies_and_accelerator_types():
  assert tpu.topology_for("v4-8") == "v4:2x2x1"
  assert tpu.topology_for("v5litepod-16") == "v5e:4x4"
  assert tpu.topology_for("v5p-8") == "v5p:2x2x1"
  assert tpu.topology_for("v5p-128") == "v5p:4x4x4"
  assert tpu.topology_for("v6e-8") == "v6e:2x4"
  assert tpu.chips_in("v5p:2x2x4") == 16
  assert tpu.topology_for("v5e-16") == "v5e:4x4"  # GKE and some docs say v5e.
  for bad in ("v3-8", "v5p-12", "v6e-3", "v5p-2", "v6e-2"):  # v5p starts at 4 chips; no 2-chip v6e.
    with pytest.raises(ConfigError):
      tpu.topology_for(bad)
  for bad in ("v5e:4x4x4", "tpu:2x2", "v7:2x2"):
    with pytest.raises(ConfigError, match="compile.topology"):
      tpu.parse(bad)


@needs_libtpu
@pytest.mark.parametrize("imports", ["rlhfjax, jax", "jax, rlhfjax"])
def test_importing_rlhfjax_silences_libtpu_on_a_cpu_host(imports):
  """Whether or not jax was imported first (as a script or notebook may do)."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith("TPU_") and k != "ALLOW_MULTIPLE_LIBTPU_LOAD"}
  code = f"import {imports}; print(jax.devices()[0].platform)"
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=ROOT, timeout=120, check=True)
  assert out.stdout.strip() == "cpu"
  assert "TPU" not in out.stderr and "libtpu" not in out.stderr, out.stderr


@needs_libtpu
def test_lora_steps_hold_adapters_and_their_moments_only(tmp_path):
  """With a `lora` block every step task=compile lowers holds what the run trains: the adapters and
  their AdamW moments beside the frozen base, and no separate reference (the LoRA policy's own base
  is its reference). Per chip, from the steps' sharded arguments (uncompiled); then the LoRA PPO
  steps and DPO compile, the decode step gathering no weight."""
  devices = tpu.devices("v5e:2x2")
  names = ("sft", "rm", "dpo", "kto", "ppo_update", "grpo_update")
  args, steps = {}, {}
  for rank in (0, 4):
    c = tiny_llama()
    c.model.dtype = "bfloat16"
    c.lora.update(rank=rank)
    par = compile_task.Parallel(compile_task.topology_mesh(devices, {"data": 1, "fsdp": 4,
                                                                     "tensor": 1}))
    steps[rank] = {s.name: s for s in compile_task.steps(c, compile_task.model_config(c), par,
                                                         names, fast_domain=4)}
    args[rank] = {n: costs.per_chip(s.args)
                  for n, s in steps[rank].items()}
  for name in names:
    assert args[4][name] < args[0][name], name
  # PPO, DPO, KTO and GRPO pass no reference tree under LoRA.
  assert steps[4]["ppo_update"].args[1] is None and steps[0]["ppo_update"].args[1] is not None
  assert steps[4]["dpo"].args[1] is None and steps[4]["grpo_update"].args[1] is None
  assert "lora" in steps[4]["sft"].args[0].params and "lora" not in steps[0]["sft"].args[0].params
  assert "lora" in steps[4]["rm"].args[0].params["backbone"]
  c = tiny_llama()
  c.model.dtype = "bfloat16"
  c.lora.update(rank=4)
  c.compile.update(topology="v5e:2x2", steps="dpo,ppo_prefill,ppo_decode,ppo_update")
  rows = compile_task.run(c, str(tmp_path))["v5e:2x2"]["rows"]
  for name in ("dpo", "ppo_prefill", "ppo_decode", "ppo_update", compile_task.RESHARD):
    assert rows[name]["fits"], name
  assert rows["ppo_decode"]["collectives"].get("all-gather", {"count": 0})["count"] == 0
