"""config.runtime: matmul precision and deterministic GPU ops reach JAX and XLA; glibc reuses XLA's
large host buffers."""

import ctypes.util
import json
import os
import platform
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from rlhfjax import main
from rlhfjax import runtime
from rlhfjax.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def restore():
  """Puts JAX's precision and XLA_FLAGS back as they were."""
  precision, flags = jax.config.jax_default_matmul_precision, os.environ.get("XLA_FLAGS")
  yield
  jax.config.update("jax_default_matmul_precision", precision)
  if flags is None:
    os.environ.pop("XLA_FLAGS", None)
  else:
    os.environ["XLA_FLAGS"] = flags


def test_auto_precision_follows_the_model_dtype():
  assert runtime.matmul_precision("auto", "float32") == "highest"
  assert runtime.matmul_precision("auto", "bfloat16") == "default"
  assert runtime.matmul_precision("tensorfloat32", "float32") == "tensorfloat32"
  with pytest.raises(ConfigError, match="runtime.matmul_precision"):
    runtime.matmul_precision("fast", "float32")
  with pytest.raises(ConfigError, match="runtime.determinism"):
    runtime.apply({"determinism": True}, "float32")


def _dot_precision() -> str:
  """The precision attribute of a float32 matmul as JAX lowers it now."""
  a = jnp.ones((8, 8), jnp.float32)
  text = jax.jit(jnp.matmul).lower(a, a).as_text()
  line = next(line for line in text.splitlines() if "dot_general" in line)
  return line.split("precision = [")[1].split(",")[0]


def test_precision_reaches_the_lowered_matmul(restore):
  assert runtime.apply({"matmul_precision": "auto"}, "float32")["matmul_precision"] == "highest"
  assert _dot_precision() == "HIGHEST"
  runtime.apply({"matmul_precision": "auto"}, "bfloat16")
  assert _dot_precision() == "DEFAULT"


_CHILD = """
import json, os, sys
from rlhfjax import runtime
before = os.environ.get("XLA_FLAGS", "")
done = runtime.apply(json.loads(sys.argv[1]), "float32")
import jax
jax.devices()  # The backend starts with the flags set: XLA accepts the flag on this platform.
print(json.dumps({"flags": os.environ.get("XLA_FLAGS", ""), "done": done,
                  "precision": jax.config.jax_default_matmul_precision}))
"""


@pytest.mark.parametrize("deterministic", [True, False])
def test_deterministic_flag_is_set_before_the_backend_starts(deterministic):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
  block = json.dumps({"deterministic": deterministic})
  out = subprocess.run([sys.executable, "-c", _CHILD, block], env=env, cwd=ROOT, check=True,
                       capture_output=True, text=True).stdout
  got = json.loads(out.splitlines()[-1])
  flags = got["flags"].split()
  assert flags[0] == "--xla_force_host_platform_device_count=2"  # The user's flags are kept.
  assert (runtime.DETERMINISTIC_FLAG in flags) == deterministic
  assert {k: v for k, v in got["done"].items() if k != "host_malloc"} == \
      {"matmul_precision": "highest", "deterministic": str(deterministic).lower()}
  assert got["precision"] == "highest"


def test_a_started_gpu_backend_without_the_flag_is_an_error(restore, monkeypatch):
  os.environ["XLA_FLAGS"] = ""
  monkeypatch.setattr(runtime.xla_bridge, "backends_are_initialized", lambda: True)
  monkeypatch.setattr(runtime.jax, "default_backend", lambda: "gpu")
  with pytest.raises(ConfigError, match="export XLA_FLAGS=--xla_gpu_deterministic_ops=true"):
    runtime.apply({"deterministic": True}, "float32")
  runtime.apply({"deterministic": False}, "float32")  # The fast setting needs no flag.
  os.environ["XLA_FLAGS"] = runtime.DETERMINISTIC_FLAG  # Set by the user: in effect all the same.
  assert runtime.apply({"deterministic": False}, "float32")["deterministic"] == "true"
  os.environ["XLA_FLAGS"] = ""
  monkeypatch.setattr(runtime.jax, "default_backend", lambda: "cpu")
  assert runtime.apply(None, "float32")["deterministic"] == "false"  # Nothing to do on a CPU.


def test_main_checks_the_runtime_block_before_any_work(tiny_config, tmp_path, restore):
  tiny_config.runtime.matmul_precision = "fast"
  with pytest.raises(ConfigError, match="runtime.matmul_precision"):
    main.run(tiny_config, str(tmp_path))
  assert not os.listdir(tmp_path)


# A step's scratch buffer as XLA:CPU's worker threads use it: allocated, written, freed, 8 times.
_MALLOC_CHILD = """
import ctypes, json, resource, sys, threading
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: 4 KiB pages, whatever THP's setting.
from rlhfjax import runtime
done = runtime.apply({"host_malloc": sys.argv[1]}, "float32")
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def steps():
  for _ in range(8):
    p = libc.malloc(64 << 20)
    libc.memset(p, 1, 64 << 20)
    libc.free(p)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
thread = threading.Thread(target=steps)
thread.start()
thread.join()
print(json.dumps({"done": done["host_malloc"], "cpu": runtime.computes_on_cpu(),
                  "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _malloc_child(setting: str, platforms: str, preload: str | None = None) -> dict:
  """The child's figures under `setting`, with glibc's malloc (the suite's tcmalloc taken out of
  LD_PRELOAD) or with `preload`."""
  env = {**{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}, "JAX_PLATFORMS": platforms}
  if preload:
    env["LD_PRELOAD"] = preload
  out = subprocess.run([sys.executable, "-c", _MALLOC_CHILD, setting], env=env, cwd=ROOT,
                       check=True, capture_output=True, text=True).stdout
  return json.loads(out.splitlines()[-1])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="host_malloc sets glibc's malloc")
def test_reuse_keeps_a_threads_large_buffer_instead_of_faulting_it_in_every_step():
  pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")  # One buffer's pages.
  reuse = _malloc_child("auto", "cpu")
  assert reuse["cpu"] and reuse["done"] == "reuse"
  assert reuse["faults"] <= 2 * pages  # Faulted in once, then reused.
  system = _malloc_child("system", "cpu")
  assert system["done"] == "system" and system["faults"] >= 4 * pages  # glibc alone: 8 times.
  elsewhere = _malloc_child("auto", "cuda")  # JAX will compute on a GPU: glibc's defaults.
  assert not elsewhere["cpu"] and elsewhere["done"] == "system"
  tcmalloc = ctypes.util.find_library("tcmalloc_minimal")
  if tcmalloc:  # Another allocator in charge: nothing to set, and the run says so.
    assert _malloc_child("reuse", "cpu", preload=tcmalloc)["done"] == "system"


def test_host_malloc_setting_is_checked_and_stays_once_the_backend_runs(restore):
  with pytest.raises(ConfigError, match="runtime.host_malloc"):
    runtime.apply({"host_malloc": "tcmalloc"}, "float32")
  jax.devices()  # The backend runs: glibc's settings stay what they were.
  first = runtime.apply({"host_malloc": "reuse"}, "float32")["host_malloc"]
  assert runtime.apply({"host_malloc": "system"}, "float32")["host_malloc"] == first


_WITHOUT = """
import json, os, sys
from rlhfjax.evaluation import summaries
from rlhfjax.training import metrics
w = metrics.MetricWriter(sys.argv[1], "m")
w.write(1, {"loss": 0.5})
w.write_text(1, "sample", "a summary")
w.close()
score = float(summaries.rouge_l(["the cats ran home"], ["a cat runs home"])[0])
hidden = [m for m in ("torch", "scipy.stats", "scipy.sparse", "sklearn") if m in sys.modules]
import scipy.stats, scipy.sparse, sklearn  # Importable again once the libraries are in.
print(json.dumps([score, hidden, os.listdir(os.path.join(sys.argv[1], "tb", "m"))]))
"""


def test_metrics_and_rouge_load_without_torch_scipy_or_sklearn(tmp_path):
  """tensorboardX and rouge-score come in without torch, scipy.stats, scipy.sparse and scikit-learn
  (rlhfjax/imports.py), and still write TensorBoard events and score ROUGE-L with stemming."""
  out = subprocess.run([sys.executable, "-c", _WITHOUT, str(tmp_path)], capture_output=True,
                       text=True, check=True, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  score, hidden, events = json.loads(out.stdout)
  # Stemmed, "cats" is "cat": the common subsequence is "cat home", 2 of 4 tokens each (0.25
  # without the stemmer).
  assert abs(score - 0.5) < 1e-6
  assert hidden == [] and len(events) == 1 and events[0].startswith("events.out.tfevents")


def test_without_hides_a_module_only_inside_the_block():
  from rlhfjax import imports
  name = "rlhfjax_never_installed_module"
  with imports.without(name, "os"):
    with pytest.raises(ImportError):
      __import__(name)
    import os as again  # Already imported: left as it is.  pylint: disable=reimported
    assert again is os
  assert name not in sys.modules
