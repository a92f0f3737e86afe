"""Parallelism on JAX's own runtime: a device Mesh, shardings, multi-host start-up, preemption.

- `mesh.py`: the (data, fsdp, tensor) Mesh from `config.mesh`.
- `sharding.py`: `Parallel` — shardings of parameters, optimizer states and batches, placing host
  data on the mesh (each process only its rows), jitting steps with in/out shardings, and reading
  results back on the host.
- `distributed.py`: `jax.distributed.initialize` from the config or the environment.
- `preemption.py`: SIGTERM → checkpoint → clean exit; the rerun resumes.
"""
