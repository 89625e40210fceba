"""Ray for every package that runs work on it: a private single-node Ray on 127.0.0.1
(:mod:`~gym_bridge.distributed.ray_local`) or an existing cluster joined by address, with its resources
reserved as placement groups (:mod:`~gym_bridge.distributed.ray_cluster`).

Its users: the Ray generation backend (:mod:`gym_bridge.generation.ray_backend`), the trainer's
data-parallel workers and environment replicas (:mod:`gym_bridge.train.data_parallel`,
:mod:`gym_bridge.train.samplers.env_replicas`) and ``collect --ray`` (:mod:`gym_bridge.collect.ray_shards`).

Substrate floor: it imports nothing of gym_bridge, and Ray (the ``[ray]`` extra) only when called.
"""
