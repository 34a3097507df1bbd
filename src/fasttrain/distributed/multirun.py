"""Hydra multirun x Lightning's DDP launcher: each sweep job's extra ranks run that job only.

For `trainer=ddp_cpu` (or any DDP strategy that starts its own processes), Lightning re-runs
the script for ranks 1..N-1 with the parent's command line plus `hydra.run.dir=...`. In a
multirun that command line is the whole sweep (`-m seed=1,2`), so every rank would start a
sweep of its own in new folders. The job running rank 0 therefore records its own overrides
and output folder in the environment (inherited by the ranks Lightning starts), and an extra
rank replaces its command line with exactly that job: one output tree per job, not per rank.
"""

from __future__ import annotations

import json
import os

JOB_ENV = "FASTTRAIN_DDP_JOB_ARGS"
# What Lightning appends for its ranks and that still applies: the job name, no second config.
_KEEP = ("hydra.job.name=", "hydra.output_subdir=")
# Lightning's launcher writes these into the parent's environment for the ranks it starts; a
# later job that still sees LOCAL_RANK believes its ranks exist already and waits for them.
# Whatever the process started with (torchrun, SLURM) is kept.
_LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
_STARTED_WITH = {k: os.environ[k] for k in _LAUNCH_VARS if k in os.environ}


def share_job_with_ranks() -> None:
    """In a multirun job (the caller asks), publish this job's overrides and folder for the
    ranks about to start."""
    import torch.distributed as dist
    from hydra.core.hydra_config import HydraConfig

    if dist.is_available() and dist.is_initialized():
        # The previous job's process group: its other ranks have exited, and Lightning would
        # reuse the group (and hang or fail on the dead peer) instead of forming a new one.
        dist.destroy_process_group()
        for key in _LAUNCH_VARS:
            if key in _STARTED_WITH:
                os.environ[key] = _STARTED_WITH[key]
            else:
                os.environ.pop(key, None)
    hc = HydraConfig.get()
    # Quoted: a sweep folder name holds "=" and "," (the overrides), which Hydra would parse.
    run_dir = f'hydra.run.dir="{hc.runtime.output_dir}"'
    # With this process's pid: the environment outlives the sweep (any later child inherits it),
    # and only the ranks this very process starts are this job's.
    os.environ[JOB_ENV] = json.dumps({"pid": os.getpid(), "args": [*hc.overrides.task, run_dir]})


def rank_argv(argv: list[str]) -> list[str]:
    """The command line this process should run: the job's own, for a rank of a sweep job
    (Lightning starts the ranks as children of the process running the job)."""
    if os.environ.get("LOCAL_RANK", "0") == "0" or JOB_ENV not in os.environ:
        return argv
    job = json.loads(os.environ[JOB_ENV])
    if not isinstance(job, dict) or job.get("pid") != os.getppid():
        return argv  # left over from another process's sweep: not this rank's job
    return [*job["args"], *(a for a in argv if a.startswith(_KEEP))]
