"""Checkpoints: read (weights_only, one-line errors), write (atomic), resume (which one, RNG,
SIGTERM).

load.py    read_checkpoint, load_task
allow.py   which code a checkpoint's specs may name (checked before anything is built)
io.py      AtomicCheckpointIO: a save is the old file or the new one, never half of each
resume.py  checkpoint_to_resume, how_to_continue: which checkpoint a run continues from
fits.py    check_fits: whether that checkpoint fits the run (loaded only when there is one)
state.py   ResumeState (position-derived RNG, last.ckpt on SIGTERM), confined restored paths
"""
